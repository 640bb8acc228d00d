# llm-qualify against the real stack: Debian's nginx with the module and an
# engine serving the demo model with the model runner.  Every gate must
# end with a real outcome; the random model's answers are "not
# meaningful", never passes; capacity targets are hit exactly and the
# over-limit request is a 400 with the numbers; artifact hashes match.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http_json
               free_port engine_name start_engine stop_engine wait_for
               repo_root build_dir api_server);
use JSON::PP;
use Digest::SHA qw(sha256_hex);

my $top = repo_root();
my $bld = build_dir();
my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('qual');
my $pid = start_engine($dir, $name, model => "$top/tests/fixtures/demo",
                       served => 'tiny-demo', max_model_len => 1024,
                       max_num_seqs => 2,
                       extra => "tensor_parallel_size: 2\nkv_cache_memory_bytes: 64MiB");
my $server = api_server($port, [qw(chat_completions completions responses
                                   models tokenize detokenize health metrics
                                   admin)]);
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=200ms passes=2 fails=3 heartbeat=3s;
    llm_admin_token qual-token;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http_json("GET", "$base/health")->{status} == 200 }, 30),
   'the demo engine is healthy behind nginx');

my $out = "$dir/qual";
my $cmd = "$bld/bin/llm-qualify --base-url $base --model tiny-demo --out $out"
        . " --admin-token qual-token --model-is-random --max-tokens 16"
        . " --engine-bin $bld/bin/llm-engine 2>$dir/qualify.log";
system($cmd);
my $rc = $? >> 8;
is($rc, 0, 'llm-qualify exits 0: no required gate failed')
    or diag(`tail -20 $dir/qualify.log`);

my $status = eval { decode_json(do { local (@ARGV, $/) = "$out/qualification-status.json"; <> }) };
ok($status, 'qualification-status.json is JSON') or BAIL_OUT('no status file');
ok(-s "$out/report.md", 'report.md written');

my %gate = map { $_->{id} => $_ } @{ $status->{gates} };
is(scalar @{ $status->{gates} }, 8, 'all eight gates reported');
for my $g (@{ $status->{gates} }) {
    like($g->{status}, qr/^(pass|fail|skipped|not_meaningful)$/,
         "gate $g->{id}: a real outcome ($g->{status})");
}
my @random = grep { $_->{status} eq 'pass' && $_->{id} =~ /quality/ } @{ $status->{gates} };
is(scalar @random, 0, 'quality gates on a random model never pass');

# the server enforces JSON mode and forced tool calls (constrained
# decoding), so those checks pass even on the random model
my ($fun) = grep { $_->{id} =~ /functional/ } @{ $status->{gates} };
my %chk = map { $_->{name} => $_ } @{ $fun->{checks} // [] };
for my $c ('json', 'tool calls', 'stream tool') {
    is($chk{$c}{status}, 'pass', "functional check '$c' passes on the random model")
        or diag(encode_json($chk{$c} // {}));
}

# capacity: targets hit exactly, the over-limit request refused with numbers
my ($cap) = grep { $_->{id} =~ /capacity/ } @{ $status->{gates} };
is($cap->{status}, 'pass', 'near-limit capacity gate passes') or diag(encode_json($cap));
my $text = encode_json($cap);
unlike($text, qr/"status":"fail"/, 'no capacity check failed');
like($text, qr/maximum context length is 1024/i, 'over-limit request: the 400 states the limit');

# every artifact's hash matches its file
my $arts = $status->{artifacts};
ok(@$arts > 10, scalar(@$arts) . ' artifacts listed');
my $bad = 0;
for my $a (@$arts) {
    open my $f, '<:raw', "$out/$a->{path}" or do { $bad++; next };
    local $/;
    my $data = <$f>;
    $bad++ unless sha256_hex($data) eq $a->{sha256};
}
is($bad, 0, 'every artifact hash matches its file');

stop_nginx($dir);
stop_engine($pid);
done_testing();
