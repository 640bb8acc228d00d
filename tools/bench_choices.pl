#!/usr/bin/perl
# n > 1 shares the prefill: wall time of one /v1/completions request with a
# 2,000-token prompt and max_tokens 1 for n = 1 and n = 4, with the demo
# model (tests/fixtures/demo, CPU) behind nginx.  Prints a table.
# usage: perl tools/bench_choices.pl   (after make and make module)
use strict; use warnings;
use FindBin;
use lib "$FindBin::Bin/../t/lib";
use LLMTest qw(repo_root scratch_dir write_conf start_nginx http free_port engine_name start_engine wait_for api_server);
use JSON::PP; use Time::HiRes qw(time);
my $dir = scratch_dir(); my $port = free_port(); my $name = engine_name('nbench');
start_engine($dir, $name, model => repo_root() . '/tests/fixtures/demo', max_num_seqs => 4, extra => "kv_cache_memory_bytes: 256MiB");
my $server = api_server($port, [qw(completions health)]);
write_conf($dir, "    llm_engine $name run_dir=$dir;\n    llm_health interval=100ms passes=1;\n$server\n");
start_nginx($dir, $port);
wait_for(sub { http('GET', "http://127.0.0.1:$port/health")->{status} == 200 }, 20) or die;
my @ids = map { 2 + ($_ * 7919) % 1000 } 1 .. 2000;
printf "| n | prompt tokens | max_tokens | wall s (best of 3) |\n| --- | --- | --- | --- |\n";
for my $n (1, 4) {
    my $best = 1e9;
    for (1 .. 3) {
        my $t = time;
        my $r = http('POST', "http://127.0.0.1:$port/v1/completions", encode_json({model => 'demo', prompt => \@ids, max_tokens => 1, n => $n}));
        die $r->{content} unless $r->{status} == 200;
        $best = time - $t if time - $t < $best;
    }
    printf "| %d | %d | 1 | %.3f |\n", $n, scalar @ids, $best;
}
