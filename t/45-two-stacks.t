# Two stacks on one host: the same engine name (the same recipe) in two run
# directories gets two segments, so both engines start and each nginx
# talks to its own.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http_json
               free_port engine_name start_engine stop_engine wait_for
               api_server);
use JSON::PP;

my $name = engine_name('twin');
my (@dir, @port, @pid);
for my $i (0, 1) {
    $dir[$i] = scratch_dir();
    $port[$i] = free_port();
    $pid[$i] = eval { start_engine($dir[$i], $name) };
    ok($pid[$i], "engine $i named $name starts in its own run_dir")
        or diag($@);
}
BAIL_OUT('the second engine was refused') unless $pid[0] && $pid[1];

my @shm = glob("/dev/shm/llm-$name-*");
is(scalar @shm, 2, 'two segments, one per run_dir') or diag("@shm");

for my $i (0, 1) {
    write_conf($dir[$i], <<"CONF");
    llm_engine $name run_dir=$dir[$i];
    llm_health interval=100ms passes=1;
    llm_test_script on;
    llm_admin_token sekrit;
@{[ api_server($port[$i], [qw(chat_completions admin)]) ]}
CONF
    start_nginx($dir[$i], $port[$i]);
}

for my $i (0, 1) {
    my $base = "http://127.0.0.1:$port[$i]";
    my $st;
    ok(wait_for(sub {
        $st = http_json('GET', "$base/admin/status", undef,
                        { Authorization => 'Bearer sekrit' })->{json};
        $st && $st->{engines}[0]{state} eq 'healthy' }, 10),
       "stack $i: its engine is healthy");
    is($st->{engines}[0]{pid}, $pid[$i], "stack $i: nginx sees its own engine");
    my $r = http_json('POST', "$base/v1/chat/completions",
        encode_json({ model => 'demo',
                      messages => [{ role => 'user', content => 'x' }],
                      test_script => { content => "stack $i" } }));
    is($r->{status}, 200, "stack $i serves a request") or diag($r->{content});
    is($r->{json}{choices}[0]{message}{content}, "stack $i",
       "stack $i: the answer comes from its engine");
}

for my $i (0, 1) {
    stop_nginx($dir[$i]);
    stop_engine($pid[$i]);
}
done_testing();
