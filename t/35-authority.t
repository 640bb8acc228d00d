# One admission authority: the engine publishes its free sequence seats
# and KV blocks in its header, and nginx's queue admits against them.
# Work nginx did not send (another client of the same engine) fills the
# engine's one seat: a request through nginx waits in nginx's queue (and
# times out there, 503 queue_timeout), not invisibly in the engine's FIFO.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http http_json
               free_port engine_name start_engine stop_engine engine_status
               wait_for api_server repo_root);
use JSON::PP;
use Time::HiRes qw(sleep);

my $dir = scratch_dir();
my $port = free_port();
my $na = engine_name('a');
my $pa = start_engine($dir, $na, max_num_seqs => 1);

my $server = api_server($port, [qw(chat_completions health metrics admin)]);
write_conf($dir, <<"CONF");
    llm_engine $na run_dir=$dir;
    llm_route demo $na;
    llm_queue 4 timeout=700ms;
    llm_health interval=100ms passes=1 fails=5 heartbeat=600ms;
    llm_test_script on;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
my $auth = { Authorization => 'Bearer sekrit' };

sub engine_state {
    my $s = http_json('GET', "$base/admin/status", undef, $auth)->{json};
    my ($e) = grep { $_->{name} eq $na } @{ $s->{engines} };
    return $e // {};
}
sub chat {
    return http_json('POST', "$base/v1/chat/completions", encode_json({
        model => 'demo', messages => [{ role => 'user', content => 'x' }],
        test_script => { content => 'ok' } }));
}

ok(wait_for(sub { (engine_state()->{state} // '') eq 'healthy' }, 10), 'engine healthy')
    or BAIL_OUT('the engine never became healthy');
my $st = engine_status($dir, $na);
is($st->{seqs_free}, 1, 'the engine publishes its free seats (max_num_seqs 1, idle)');
cmp_ok($st->{kv_blocks_free} // 0, '>', 0, 'and its free KV blocks');

# ---- another client holds the engine's one seat ---------------------------
open my $f, '>', "$dir/outside.json" or die $!;
print $f encode_json({ messages => [{ role => 'user', content => 'x' }],
                       test_script => { content => 'z' x 25, step_ms => 100 } });
close $f;
my $bin = repo_root() . '/build/bin/llm-engine';
my $outside = fork() // die "fork: $!";
if ($outside == 0) {
    open STDOUT, '>', '/dev/null';
    exec $bin, 'client', '--run-dir', $dir, '--name', $na, '--request', "$dir/outside.json";
    exit 127;
}
ok(wait_for(sub { (engine_status($dir, $na)->{running} // 0) == 1 }, 5),
   'the outside request runs on the engine');
is(engine_status($dir, $na)->{seqs_free}, 0, 'the engine says: no free seat');
my $r = chat();
is($r->{status}, 503, 'a request through nginx waits in nginx\'s queue, not the engine\'s');
is($r->{json}{error}{code}, 'queue_timeout', 'and times out there (queue_timeout)');
waitpid($outside, 0);
is($? >> 8, 0, 'the outside request finished normally');
ok(wait_for(sub { (engine_status($dir, $na)->{seqs_free} // 0) == 1 }, 5),
   'the seat is free again');
is(chat()->{status}, 200, 'then nginx admits at once');

stop_nginx($dir);
stop_engine($pa);
done_testing();
