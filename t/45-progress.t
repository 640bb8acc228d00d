# Health follows the scheduler, not just the process: a wedged scheduler
# thread (the heartbeat thread still beating) makes the engine unhealthy
# after llm_health stall=, and it is readmitted once steps resume.  Probes
# have a seat of their own: readmission does not wait for running streams
# that fill max_num_seqs.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http_json
               free_port engine_name start_engine stop_engine wait_for
               raw_open raw_response api_server);
use JSON::PP;
use Time::HiRes qw(sleep);

my $dir = scratch_dir();
my $port = free_port();
my $na = engine_name('a');
my $pa = start_engine($dir, $na, max_num_seqs => 2);

my $server = api_server($port, [qw(chat_completions health admin)]);
write_conf($dir, <<"CONF");
    llm_engine $na run_dir=$dir;
    llm_route demo $na;
    llm_health interval=100ms passes=2 fails=2 heartbeat=600ms stall=1s;
    llm_test_script on;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
my $auth = { Authorization => 'Bearer sekrit' };

sub health { http_json('GET', "$base/health") }
sub state_of {
    my $s = http_json('GET', "$base/admin/status", undef, $auth)->{json};
    my ($e) = grep { $_->{name} eq $na } @{ $s->{engines} };
    return $e // {};
}
sub healthy { (state_of()->{state} // '') eq 'healthy' }
sub chat {
    my ($script) = @_;
    return http_json('POST', "$base/v1/chat/completions", encode_json({
        model => 'demo', messages => [{ role => 'user', content => 'x' }],
        test_script => $script }));
}
sub stream {
    my ($script) = @_;
    return raw_open($port, 'POST', '/v1/chat/completions', encode_json({
        model => 'demo', messages => [{ role => 'user', content => 'x' }],
        stream => JSON::PP::true, test_script => $script }));
}

ok(wait_for(sub { healthy() }, 10), 'engine healthy')
    or BAIL_OUT('the engine never became healthy');

# ---- a wedged scheduler ------------------------------------------------------
# One step of this script holds the scheduler thread for 4 s; the engine's
# heartbeat thread goes on beating meanwhile.
my $w = raw_open($port, 'POST', '/v1/chat/completions', encode_json({
    model => 'demo', messages => [{ role => 'user', content => 'x' }],
    test_script => { content => 'ab', step_ms => 4000 } }));
ok(wait_for(sub { health()->{status} == 503 }, 3),
   '/health 503 while the scheduler makes no progress');
like(state_of()->{reason}, qr/scheduler made no progress/,
     'reason: the scheduler is stalled (not the heartbeat)');
ok(wait_for(sub { healthy() }, 15), 'readmitted once the scheduler moves again');
is(health()->{status}, 200, '/health 200 again');
my $r = raw_response($w, 15);
close $w;
is($r->{status}, 200, 'the request that wedged the step still completes');
like($r->{body}, qr/"content":"ab"/, 'with its whole answer');

# ---- probes do not wait behind full slots -------------------------------------
# Two long streams fill max_num_seqs = 2; a stall of the whole engine
# (SIGSTOP past heartbeat=) makes it unhealthy; once it runs again its
# probes must run beside the streams.
my @long = map { stream({ content => 'z' x 400, step_ms => 50 }) } 1 .. 2;
ok(wait_for(sub { (state_of()->{running} // 0) == 2 }, 5), 'two streams running');
kill 'STOP', $pa;
ok(wait_for(sub { !healthy() }, 3), 'a stalled engine: unhealthy');
kill 'CONT', $pa;
ok(wait_for(sub { healthy() }, 15), 'readmitted by probes');
is(state_of()->{running}, 2,
   'readmitted while both streams still hold max_num_seqs (probes did not queue behind them)');
close $_ for @long;
ok(wait_for(sub { (state_of()->{running} // 1) == 0 }, 5), 'streams gone');
is(chat({ content => 'ok' })->{status}, 200, 'serving');

stop_nginx($dir);
stop_engine($pa);
done_testing();
