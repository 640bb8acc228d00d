# The prefix cache's disk tier through nginx with the demo model (CPU): an
# engine with kv_offloading_filesystem writes its cache to
# kv_offloading_path when it stops; restarted, it answers a prompt that
# repeats the earlier one's prefix from those files (cached_tokens > 0)
# with the same greedy output as a cold engine; /admin/reset_prefix_cache
# deletes the files.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(repo_root scratch_dir write_conf start_nginx http http_json
               free_port engine_name start_engine stop_engine wait_for api_server);
use JSON::PP;

my $top = repo_root();
my $dir = scratch_dir();
my $port = free_port();
my $disk = engine_name('pdisk');
my $cold = engine_name('pdcold');
my %disk_engine = (model => "$top/tests/fixtures/demo", served => 'demo',
                   extra => "kv_cache_memory_bytes: 64MiB\nkv_offloading_size: 0.01\n"
                            . "kv_offloading_filesystem: true\nkv_offloading_path: $dir/kv");
my $pid = start_engine($dir, $disk, %disk_engine);
start_engine($dir, $cold, model => "$top/tests/fixtures/demo", served => 'cold',
             extra => "kv_cache_memory_bytes: 64MiB\nenable_prefix_caching: false");
my $server = api_server($port, [qw(completions health admin)]);
write_conf($dir, <<"CONF");
    llm_engine $disk run_dir=$dir;
    llm_engine $cold run_dir=$dir;
    llm_health interval=100ms passes=1;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
sub healthy { wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 20) }
ok(healthy(), 'both engines become healthy') or BAIL_OUT('engines never became healthy');

sub complete {
    my ($model, $ids) = @_;
    return http_json('POST', "$base/v1/completions",
                     encode_json({ model => $model, prompt => $ids, max_tokens => 6,
                                   temperature => 0 }));
}
my @p = map { 2 + ($_ * 7919) % 3000 } 1 .. 600;
my $r1 = complete('demo', \@p);
is($r1->{status}, 200, 'a first prompt') or diag($r1->{content});

stop_engine($pid);
my @files = glob("$dir/kv/*/*.kv");
cmp_ok(scalar @files, '>=', 4, 'the stopped engine wrote its cache to kv_offloading_path ('
       . scalar(@files) . ' files)');
$pid = start_engine($dir, $disk, %disk_engine);
ok(healthy(), 'the engine restarts and is readmitted');

my @q = (@p, map { 2 + ($_ * 31) % 3000 } 1 .. 40);
my $w = complete('demo', \@q);
my $c = complete('cold', \@q);
my $cached = $w->{json}{usage}{prompt_tokens_details}{cached_tokens} // 0;
cmp_ok($cached, '>=', 512, "after the restart the repeated prefix comes from disk ($cached tokens)")
    or diag($w->{content});
is($w->{json}{choices}[0]{text}, $c->{json}{choices}[0]{text},
   'the same greedy output as the cold engine');

my $auth = { Authorization => 'Bearer sekrit' };
my $x = http_json('POST', "$base/admin/reset_prefix_cache?engine=$disk", '', $auth);
ok($x->{status} == 200 && ($x->{json}{freed}{disk_files} // 0) > 0 && !glob("$dir/kv/*/*.kv"),
   "a reset deletes the disk tier's files ($x->{json}{freed}{disk_files})") or diag($x->{content});

done_testing();
