# Global admission: with max_num_seqs=1 one request runs at a time across
# both workers, llm_queue more wait (FIFO), the rest get 429; queue_timeout
# gives 503; clients that leave while queued or running free their place
# and cancel their sequence; nothing is left behind in the zone or engine.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http http_json
               free_port engine_name start_engine stop_engine engine_status
               wait_for raw_open raw_response api_server);
use JSON::PP;
use Time::HiRes qw(sleep time);

my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('adm');
my $epid = start_engine($dir, $name, max_num_seqs => 1, slots => 8);

my $server = api_server($port, [qw(chat_completions health admin)],
                        listen => 'reuseport');
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=100ms passes=1;
    llm_queue 2 timeout=1500ms;
    llm_retry_after 3s;
    llm_test_script on;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 10),
   'engine healthy') or BAIL_OUT('engine never became healthy');

my $auth = { Authorization => 'Bearer sekrit' };

sub zone {
    my $s = http_json('GET', "$base/admin/status", undef, $auth)->{json};
    return ($s->{engines}[0]{running}, $s->{waiting});
}

sub body {
    my (%script) = @_;
    return encode_json({ model => 'demo',
                         messages => [{ role => 'user', content => 'x' }],
                         test_script => \%script, %{ delete $script{top} // {} } });
}

# ---- one at a time, two waiting, the rest refused --------------------------
my @socks = map { raw_open($port, 'POST', '/v1/chat/completions',
                           body(content => 'abcd', step_ms => 150)) } 1 .. 5;
my ($max_run, $max_wait) = (0, 0);
for (1 .. 20) {
    my ($run, $wait) = zone();
    $max_run = $run if $run > $max_run;
    $max_wait = $wait if $wait > $max_wait;
    sleep 0.05;
}
my @res = map { raw_response($_, 15) } @socks;
close $_ for @socks;
my @ok = grep { $_->{status} == 200 } @res;
my @busy = grep { $_->{status} == 429 } @res;
is(scalar @ok, 3, 'one running + two queued are served');
is(scalar @busy, 2, 'the other two get 429');
is($max_run, 1, 'never more than max_num_seqs running');
is($max_wait, 2, 'the queue holds llm_queue requests');
my $e = eval { decode_json($busy[0]{body})->{error} } // {};
is($e->{code}, 'queue_full', '429 code queue_full');
is($busy[0]{headers}{'retry-after'}, 3, '429 Retry-After from llm_retry_after');
is(eval { decode_json($ok[0]{body})->{choices}[0]{message}{content} }, 'abcd',
   'served requests complete');
is_deeply([zone()], [0, 0], 'zone counters back to 0');

# ---- queue timeout ------------------------------------------------------------
my $long = raw_open($port, 'POST', '/v1/chat/completions',
                    body(content => 'abcdefghij', step_ms => 300));
wait_for(sub { (zone())[0] == 1 }, 5);
my $t0 = time();
my $r = http_json('POST', "$base/v1/chat/completions",
                  body(content => 'late'));
my $waited = time() - $t0;
is($r->{status}, 503, 'queued past queue_timeout: 503');
is($r->{json}{error}{code}, 'queue_timeout', 'code queue_timeout');
ok($r->{headers}{'retry-after'}, '503 carries Retry-After');
cmp_ok($waited, '>=', 1.4, 'it waited for the queue timeout first');
is(raw_response($long, 15)->{status}, 200, 'the running request finished');
close $long;
is_deeply([zone()], [0, 0], 'zone counters back to 0 after a timeout');

# ---- clients that leave ---------------------------------------------------------
my $before = engine_status($dir, $name)->{requests_cancelled};

# (long enough to be running still when it leaves on a loaded machine:
# 40 steps of 100 ms once finished first under CI and cancelled nothing)
$long = raw_open($port, 'POST', '/v1/chat/completions',
                 body(content => 'a' x 400, step_ms => 100));
wait_for(sub { (zone())[0] == 1 }, 5);
my $queued = raw_open($port, 'POST', '/v1/chat/completions',
                      body(content => 'never'));
ok(wait_for(sub { (zone())[1] == 1 }, 5), 'second request queued');
close $queued;
ok(wait_for(sub { (zone())[1] == 0 }, 5),
   'a client that leaves while queued frees its place');

close $long;
ok(wait_for(sub { (zone())[0] == 0 }, 5),
   'a client that leaves while running frees its place');
ok(wait_for(sub { engine_status($dir, $name)->{requests_cancelled} > $before }, 5),
   'and the engine cancels its sequence');

my $stream = raw_open($port, 'POST', '/v1/chat/completions',
                      body(content => 'b' x 400, step_ms => 100,
                           top => { stream => JSON::PP::true }));
my $got = '';
for (1 .. 100) {
    sysread($stream, my $buf, 4096) or last;
    $got .= $buf;
    last if (() = $got =~ /"content":"b"/g) >= 3;
}
like($got, qr/HTTP\/1.1 200/, 'streaming started');
$before = engine_status($dir, $name)->{requests_cancelled};
close $stream;
ok(wait_for(sub { (zone())[0] == 0 }, 5),
   'a client that leaves mid-stream frees its place');
ok(wait_for(sub { engine_status($dir, $name)->{requests_cancelled} > $before }, 5),
   'and the engine cancels the stream');

$r = http_json('POST', "$base/v1/chat/completions", body(content => 'next'));
is($r->{status}, 200, 'the next request runs at once');

# ---- nothing left behind ----------------------------------------------------------
is_deeply([zone()], [0, 0], 'zone: nothing running, nothing waiting');
my $st = wait_for(sub {
    my $s = engine_status($dir, $name);
    $s && $s->{slot_states}{free} == 8 ? $s : undef }, 5);
ok($st, 'engine: every slot free again')
    or diag(encode_json(engine_status($dir, $name)->{slot_states}));

stop_nginx($dir);
stop_engine($epid);
done_testing();
