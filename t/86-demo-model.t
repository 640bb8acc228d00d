# The trained demo model (issue 19): tools/demo_data.py is deterministic by
# seed, and tests/fixtures/demo-trained, served through nginx on the CPU at
# TP=2 as `make run` serves it, answers held-out questions greedily: operand
# pairs the generator never trained on (a product with its run of multiples),
# a calculator call with a held-out expression, a weather call with the city
# from the user's words, and a continuation that uses the tool's result;
# llm-qualify's functional preflight passes without --model-is-random.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(repo_root build_dir scratch_dir write_conf start_nginx http http_json
               free_port engine_name start_engine wait_for api_server);
use JSON::PP;

my $top = repo_root();
my $dir = scratch_dir();
my $gen = "python3 $top/tools/demo_data.py";
my $bld = build_dir();
my $engine_opt = "--engine $bld/bin/llm-engine";

sub slurp { local (@ARGV, $/) = @_; <> }

# ---- the generator ---------------------------------------------------------
for my $run ([a => 7], [b => 7], [c => 8]) {
    my ($tag, $seed) = @$run;
    system("$gen train --seed $seed --n 40 --out $dir/$tag.bin $engine_opt >/dev/null") == 0
        or BAIL_OUT("demo_data.py train failed");
    system("$gen eval --seed $seed --per-kind 2 --out $dir/$tag.jsonl $engine_opt >/dev/null") == 0
        or BAIL_OUT("demo_data.py eval failed");
}
my $a = slurp("$dir/a.bin");
is(substr($a, 0, 12), "DV4DATA1" . pack('V', 40), 'train file: magic and 40 examples');
ok($a eq slurp("$dir/b.bin"), 'same seed: byte-identical training data');
ok($a ne slurp("$dir/c.bin"), 'another seed: different training data');
ok(slurp("$dir/a.jsonl") eq slurp("$dir/b.jsonl"), 'same seed: identical held-out prompts');
my @evals = map { decode_json($_) } split /\n/, slurp("$dir/a.jsonl");
is(scalar @evals, 8, 'two held-out prompts of each of the four kinds');

# every example's mask starts right after an <｜Assistant｜> think marker and
# ends on an EOS; the prompt itself is never predicted
my ($off, $bad, $n) = (12, 0, 0);
while ($off < length $a) {
    my $len = unpack('V', substr($a, $off, 4));
    my @ids = unpack('v*', substr($a, $off + 4, 2 * $len));
    my @mask = unpack('C*', substr($a, $off + 4 + 2 * $len, $len));
    $off += 4 + 3 * $len;
    $n++;
    $bad++ if $mask[0] || $mask[1] || !$mask[-1] || $ids[-1] != 1;
    for my $i (1 .. $#ids) {
        $bad++ if $mask[$i] && !$mask[$i - 1] && $ids[$i - 2] != 3906;
    }
}
is($n, 40, 'the file holds 40 examples');
is($bad, 0, 'loss masks cover assistant turns only, each ending on EOS');

my $held = `cd $top/tools && python3 -c 'import demo_data as d; print(d.held("cmp", 96, 37), d.held("*", 1, 3), d.held("*", 4, 11), d.held("calc", 664, 37), "Paris" in d.HELD_CITIES)'`;
is($held, "True True True True False\n",
   '96 vs 37, 1 x 3, 4 x 11 and the calculator\'s 664 * 37 are held out of training, Paris is not');

# ---- the trained model behind nginx -----------------------------------------
my $port = free_port();
my $name = engine_name('trained');
start_engine($dir, $name, model => "$top/tests/fixtures/demo-trained", served => 'tiny-demo',
             max_model_len => 4096, extra => "tensor_parallel_size: 2");
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=100ms passes=1;
@{[ api_server($port, [qw(chat_completions responses models tokenize health)]) ]}
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 30),
   'the trained model becomes healthy') or BAIL_OUT('engine never became healthy');

sub chat {
    my (%body) = @_;
    my $r = http_json('POST', "$base/v1/chat/completions",
                      encode_json({ model => 'tiny-demo', temperature => 0, max_tokens => 128, %body }));
    is($r->{status}, 200, 'chat: 200') or diag($r->{content});
    return $r->{json}{choices}[0]{message};
}

is(chat(messages => [{ role => 'user', content => 'Which is larger, 96 or 37?' }])->{content},
   '96 is larger than 37.', 'held-out comparison answered correctly');
# a product comes with its numbered run of multiples, then the result
is(chat(messages => [{ role => 'user', content => 'What is 1 x 3?' }])->{content},
   '1 * 3: 1:3. 1 * 3 = 3.', 'held-out product answered correctly');
is(chat(messages => [{ role => 'user', content => 'What is 4 x 11?' }])->{content},
   '4 * 11: 1:11, 2:22, 3:33, 4:44. 4 * 11 = 44.', 'held-out product: the run of multiples and the result');

my $tools = decode_json('[{"type":"function","function":{"name":"get_weather",'
    . '"description":"Get the current weather for a city.","parameters":{"type":"object",'
    . '"properties":{"city":{"type":"string"}},"required":["city"]}}}]');
my $ask = { role => 'user', content => 'What is the weather in Paris?' };
my $m = chat(messages => [$ask], tools => $tools);
is($m->{tool_calls}[0]{function}{name}, 'get_weather', 'a tool call when tools are given');
is_deeply(decode_json($m->{tool_calls}[0]{function}{arguments} // '{}'), { city => 'Paris' },
          'its argument is the city the user named');

my $calc = decode_json('[{"type":"function","function":{"name":"calculator",'
    . '"description":"Evaluate an arithmetic expression exactly.","parameters":{"type":"object",'
    . '"properties":{"expression":{"type":"string"}},"required":["expression"]}}}]');
$m = chat(messages => [{ role => 'user', content => 'What is 664 * 37? Use the calculator.' }],
          tools => $calc);
is($m->{tool_calls}[0]{function}{name}, 'calculator', 'a calculator call when asked to use it');
is_deeply(decode_json($m->{tool_calls}[0]{function}{arguments} // '{}'), { expression => '664*37' },
          'its expression copies the held-out operands');

my $call = { role => 'assistant', content => undef, tool_calls => [{ id => 'call_1',
             type => 'function', function => { name => 'get_weather',
             arguments => '{"city": "Paris"}' } }] };
my $result = { role => 'tool', tool_call_id => 'call_1',
               content => '{"city": "Paris", "temperature_c": 21, "sky": "clear"}' };
like(chat(messages => [$ask, $call, $result], tools => $tools)->{content}, qr/\b21\b/,
     'the continuation uses the tool result');

# ---- llm-qualify's functional preflight, for real (no --model-is-random) ----
my $out = "$dir/qual";
system("$bld/bin/llm-qualify --base-url $base --model tiny-demo --out $out --gates functional"
       . " --max-tokens 128 --tool-calls 4 2>$dir/qualify.log");
is($? >> 8, 0, 'llm-qualify --gates functional exits 0') or diag(`tail -20 $dir/qualify.log`);
my $status = eval { decode_json(slurp("$out/qualification-status.json")) } // {};
my ($fn) = grep { $_->{id} eq 'functional' } @{ $status->{gates} // [] };
is($fn && $fn->{status}, 'pass', 'the functional preflight passes on the trained model')
    or diag(explain($fn));

done_testing();
