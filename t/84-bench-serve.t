# llm-bench-serve against the real stack: Debian's nginx with the module
# and an engine serving the demo model on the CPU.  Small (8 requests,
# 4 at a time); asserts that it completes and that its numbers are
# consistent with each other (tokens counted equal usage, throughputs
# equal tokens over duration, percentiles ordered), never their speed.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http_json
               free_port engine_name start_engine stop_engine wait_for
               repo_root api_server);
use JSON::PP;

my $top = repo_root();
my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('bench');
my $pid = start_engine($dir, $name, model => "$top/tests/fixtures/demo",
                       served => 'tiny-demo', max_model_len => 1024, max_num_seqs => 4,
                       extra => "tensor_parallel_size: 2\nkv_cache_memory_bytes: 64MiB");
my $server = api_server($port, [qw(chat_completions tokenize health)]);
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=200ms passes=2 fails=3 heartbeat=3s;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http_json("GET", "$base/health")->{status} == 200 }, 30),
   'the demo engine is healthy behind nginx');

my $bin = LLMTest::build_dir() . "/bin/llm-bench-serve";
my ($n, $c, $in, $out) = (8, 4, 48, 8);
my $json = "$dir/bench.json";
my $cmd = "$bin --base-url $base --model tiny-demo --num-prompts $n --concurrency $c"
        . " --input-len $in --output-len $out --logprobs --seed 7 --json $json";
my $table = `$cmd 2>$dir/bench.log`;
is($? >> 8, 0, 'llm-bench-serve exits 0') or diag(`cat $dir/bench.log`);
note($table);
like($table, qr/Serving Benchmark Result.*Output token throughput.*Median TTFT.*P99 ITL/s,
     'the table has vLLM\'s columns');

my $r = eval { decode_json(do { local (@ARGV, $/) = $json; <> }) };
ok($r, 'the JSON results parse') or BAIL_OUT('no results');
is($r->{completed}, $n, "$n requests completed");
is($r->{failed}, 0, 'none failed');
is($r->{total_input_tokens}, $n * $in, 'input tokens: exactly --input-len each (usage)');
is($r->{total_output_tokens}, $n * $out, 'output tokens: exactly --output-len each (usage)');
is($r->{counted_output_tokens}, $r->{total_output_tokens},
   'logprob entries streamed equal usage.completion_tokens');
ok($r->{text_chunks} >= $n && $r->{text_chunks} <= $n * $out,
   "chunks with text ($r->{text_chunks}) between one and one per token per request");
my $close = sub { abs($_[0] - $_[1]) <= 1e-4 * abs($_[1]) + 1e-6 };
ok($close->($r->{output_throughput} * $r->{duration}, $n * $out),
   'output throughput x duration = output tokens');
ok($close->($r->{total_token_throughput} * $r->{duration}, $n * ($in + $out)),
   'total throughput x duration = all tokens');
ok($close->($r->{request_throughput} * $r->{duration}, $n),
   'request throughput x duration = requests');
for my $m (qw(ttft tpot itl e2el)) {
    my @p = map { $r->{"${_}_${m}_ms"} } qw(median p90 p99);
    ok($p[0] > 0 && $p[0] <= $p[1] && $p[1] <= $p[2], "$m: 0 < p50 <= p90 <= p99 (@p)");
}
ok($r->{p99_ttft_ms} <= $r->{p99_e2el_ms}, 'TTFT within end-to-end latency');
ok($r->{duration} * 1000 >= $r->{median_e2el_ms}, 'a request within the run');

# errors name the problem
my $err = `$bin --base-url $base --model no-such-model --num-prompts 1 --input-len 40 2>&1 >/dev/null`;
isnt($? >> 8, 0, 'an unknown model fails');
like($err, qr/no-such-model|model/i, 'and says which') or diag($err);
note($err);
$err = `$bin --base-url $base --model tiny-demo --num-prompts 1 --input-len 2 2>&1 >/dev/null`;
is($? >> 8, 2, 'an input length below the chat template fails at setup');
like($err, qr/target 2 is below/, 'and says why') or diag($err);
note($err);
$err = `$bin --model tiny-demo --concurrency 0 2>&1`;
is($? >> 8, 2, 'a bad option value is a usage error');
like($err, qr/--concurrency: bad value '0'/, 'naming the option');
note($err);
$err = `$bin --base-url $base --model tiny-demo --num-prompts 1 --input-len 40 --output-len 2000 2>&1 >/dev/null`;
isnt($? >> 8, 0, 'a request over max_model_len fails');
like($err, qr/HTTP 400/, 'with the server\'s 400') or diag($err);
note($err);

stop_nginx($dir);
stop_engine($pid);
done_testing();
