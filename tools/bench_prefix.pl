#!/usr/bin/perl
# Prefix caching: wall time of a /v1/completions request (max_tokens 1)
# whose prompt repeats an earlier prompt plus 100 new tokens, on an engine
# with the prefix cache (the earlier prompt sent just before) and on one
# without it, with the demo model (tests/fixtures/demo, CPU) behind nginx.
# Each round uses new token ids.  Prints a table.
# usage: perl tools/bench_prefix.pl   (after make and make module)
use strict; use warnings;
use FindBin;
use lib "$FindBin::Bin/../t/lib";
use LLMTest qw(repo_root scratch_dir write_conf start_nginx http free_port engine_name start_engine wait_for api_server);
use JSON::PP; use Time::HiRes qw(time);
my $dir = scratch_dir(); my $port = free_port();
my ($warm, $cold) = (engine_name('pbwarm'), engine_name('pbcold'));
my $demo = repo_root() . '/tests/fixtures/demo';
start_engine($dir, $warm, model => $demo, served => 'warm', max_model_len => 8192, extra => "kv_cache_memory_bytes: 256MiB");
start_engine($dir, $cold, model => $demo, served => 'cold', max_model_len => 8192, extra => "kv_cache_memory_bytes: 256MiB\nenable_prefix_caching: false");
my $server = api_server($port, [qw(completions health)]);
write_conf($dir, "    llm_engine $warm run_dir=$dir;\n    llm_engine $cold run_dir=$dir;\n    llm_health interval=100ms passes=1;\n$server\n");
start_nginx($dir, $port);
wait_for(sub { http('GET', "http://127.0.0.1:$port/health")->{status} == 200 }, 20) or die;
sub send_ids {
    my ($model, $ids) = @_;
    my $t = time;
    my $r = http('POST', "http://127.0.0.1:$port/v1/completions", encode_json({model => $model, prompt => $ids, max_tokens => 1}));
    die $r->{content} unless $r->{status} == 200;
    return (time - $t, decode_json($r->{content})->{usage}{prompt_tokens_details}{cached_tokens});
}
printf "| prompt tokens | cold s (best of 3) | cached s (best of 3) | cached tokens | cached / cold |\n| --- | --- | --- | --- | --- |\n";
my $round = 0;
for my $len (2000, 4000) {
    my ($bc, $bw, $cached) = (1e9, 1e9, 0);
    for (1 .. 3) {
        $round++;
        my @p = map { 2 + ($_ * 7919 + $round * 104729) % 3900 } 1 .. $len;
        my @q = (@p, map { 2 + ($_ * 31 + $round) % 3900 } 1 .. 100);
        my ($tc) = send_ids('cold', \@q);
        send_ids('warm', \@p);
        my ($tw, $c) = send_ids('warm', \@q);
        $bc = $tc if $tc < $bc;
        ($bw, $cached) = ($tw, $c) if $tw < $bw;
    }
    printf "| %d | %.3f | %.3f | %d | %.1f%% |\n", $len + 100, $bc, $bw, $cached, 100 * $bw / $bc;
}
