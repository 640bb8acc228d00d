# Health, routing and readmission: engine kill mid-stream (error event,
# /health 503 within 1 s, readmission after restart), stale heartbeat,
# failed requests vs client errors, drain and resume, promote, metrics.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http http_json
               free_port engine_name start_engine stop_engine kill_engine
               wait_for raw_open raw_response sse_read api_server);
use JSON::PP;
use Time::HiRes qw(sleep time);

my $dir = scratch_dir();
my $port = free_port();
my ($na, $nb) = (engine_name('a'), engine_name('b'));
my $pa = start_engine($dir, $na, max_num_seqs => 2);
my $pb = start_engine($dir, $nb, max_num_seqs => 2);

my $server = api_server($port, [qw(chat_completions health metrics admin)]);
write_conf($dir, <<"CONF");
    llm_engine $na run_dir=$dir;
    llm_engine $nb run_dir=$dir;
    llm_route demo $na;
    llm_health interval=100ms passes=2 fails=2 heartbeat=600ms;
    llm_test_script on;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
my $auth = { Authorization => 'Bearer sekrit' };

sub health { http_json('GET', "$base/health") }
sub state_of {
    my ($n) = @_;
    my $s = http_json('GET', "$base/admin/status", undef, $auth)->{json};
    my ($e) = grep { $_->{name} eq $n } @{ $s->{engines} };
    return $e;
}
sub healthy { (state_of($_[0]) // {})->{state} eq 'healthy' }
sub admin { http_json('POST', "$base/admin/$_[0]", '', $auth) }
sub chat {
    my (%o) = @_;
    my $script = delete $o{script} // { content => 'ok' };
    return http_json('POST', "$base/v1/chat/completions", encode_json({
        model => 'demo', messages => [{ role => 'user', content => 'x' }],
        test_script => $script, %o }));
}

ok(wait_for(sub { healthy($na) && healthy($nb) }, 10), 'both engines healthy')
    or BAIL_OUT('engines never became healthy');
my $h = health();
is($h->{status}, 200, '/health 200 when the routes can serve');
my ($route) = grep { $_->{model} eq 'demo' } @{ $h->{json}{routes} };
is_deeply($route->{engines}, [$na], 'llm_route wins over served names');
is(chat()->{json}{system_fingerprint}, "fp_scripted_$na", 'demo runs on a');

# ---- admin access ------------------------------------------------------------
is(http('GET', "$base/admin/status")->{status}, 401, 'admin needs the token');
is(http('GET', "$base/admin/status", undef,
        { Authorization => 'Bearer wrong' })->{status}, 401, 'wrong token: 401');
is(http('GET', "$base/admin/drain?engine=$na", undef, $auth)->{status}, 405,
   'drain needs POST');
is(admin('drain?engine=nope')->{status}, 404, 'unknown engine: 404');
my $rp = admin("reset_prefix_cache?engine=$na");
ok($rp->{status} == 400 && ($rp->{json}{error}{message} // '') =~ /no admin operations/,
   'reset_prefix_cache on an engine without a prefix cache (the test runner): 400')
    or diag($rp->{content});

# ---- promote -----------------------------------------------------------------
my $r = admin("promote?route=demo&engine=$nb");
is($r->{status}, 200, 'promote to a healthy engine that passes a probe');
is($r->{json}{engine}, $nb, 'promote answer names the engine');
is(chat()->{json}{system_fingerprint}, "fp_scripted_$nb",
   'the route now runs on b');
is(admin("promote?route=demo&engine=$na")->{status}, 200, 'promote back to a');
is(chat()->{json}{system_fingerprint}, "fp_scripted_$na", 'and back on a');

# ---- drain and resume -----------------------------------------------------------
is(admin("drain?engine=$nb")->{status}, 200, 'drain b');
is(state_of($nb)->{state}, 'draining', 'b is draining');
$r = admin("promote?route=demo&engine=$nb");
is($r->{status}, 409, 'promotion to a draining engine is refused');
is($r->{json}{error}{code}, 'engine_unhealthy', 'refusal code');
is(admin("resume?engine=$nb")->{status}, 200, 'resume b');
is(state_of($nb)->{state}, 'healthy', 'b is healthy again');

my $slow = raw_open($port, 'POST', '/v1/chat/completions', encode_json({
    model => 'demo', messages => [{ role => 'user', content => 'x' }],
    test_script => { content => 'slowly', step_ms => 100 } }));
sleep 0.2;
is(admin("drain?engine=$na")->{status}, 200, 'drain a while a request runs');
$r = chat();
is($r->{status}, 503, 'new requests to a draining route: 503');
like($r->{json}{error}{message}, qr/draining/, 'the message says draining');
ok($r->{headers}{'retry-after'}, 'with Retry-After');
is(health()->{status}, 503, '/health 503 while the route cannot serve');
my $done = raw_response($slow, 10);
close $slow;
is($done->{status}, 200, 'the running request finished during the drain');
like($done->{body}, qr/"content":"slowly"/, 'with its whole answer');
is(admin("resume?engine=$na")->{status}, 200, 'resume a');
is(chat()->{status}, 200, 'served again after resume');

# ---- failed requests count, client errors do not --------------------------------
for (1 .. 3) {
    chat(script => { error => { status => 400, code => 'bad', message => 'no' } });
}
ok(healthy($na), 'client errors (400) never count against an engine');
for (1 .. 2) {
    chat(script => { error => { status => 500, code => 'oops', message => 'boom' } });
}
ok(wait_for(sub { `grep -c 'healthy -> unhealthy: 2 requests in a row failed' $dir/logs/error.log` > 0 }, 2),
   'fails= consecutive failed requests: unhealthy, with the reason logged');
ok(wait_for(sub { healthy($na) }, 5), 'then readmitted by probes');

# ---- kill -9 mid-stream --------------------------------------------------------------
my $s = raw_open($port, 'POST', '/v1/chat/completions', encode_json({
    model => 'demo', stream => JSON::PP::true,
    messages => [{ role => 'user', content => 'x' }],
    test_script => { content => 'z' x 50, step_ms => 100 } }));
sleep 0.4;
kill_engine($pa);
my $t0 = time();
my $res = raw_response($s, 5);
close $s;
my @ev = sse_read($res->{body});
is($res->{status}, 200, 'the stream had started');
is($ev[-1][1], '[DONE]', 'the stream still ends with [DONE]');
my $err = eval { decode_json($ev[-2][1])->{error} };
ok($err && $err->{message}, 'an error event comes before [DONE]')
    or diag($res->{body});
cmp_ok(time() - $t0, '<', 1, 'the client learns at once');
ok(wait_for(sub { health()->{status} == 503 }, 1), '/health 503 within 1 s');
like(state_of($na)->{reason}, qr/doorbell socket closed/,
     'reason: the doorbell socket closed');
is(chat()->{status}, 503, 'requests get 503 while a is down');

$pa = start_engine($dir, $na, max_num_seqs => 2);
ok(wait_for(sub { health()->{status} == 200 }, 10), 'readmitted after restart');
my $st = state_of($na);
is($st->{state}, 'healthy', 'a is healthy');
like($st->{reason}, qr/2 probes in a row passed/, 'after passes= probes');
is(chat()->{status}, 200, 'serving again');

# ---- stale heartbeat ------------------------------------------------------------------
kill 'STOP', $pa;
ok(wait_for(sub { !healthy($na) }, 3), 'a stopped engine goes unhealthy');
like(state_of($na)->{reason}, qr/heartbeat stale/, 'reason: stale heartbeat');
kill 'CONT', $pa;
ok(wait_for(sub { healthy($na) }, 5), 'and comes back when it resumes');

# ---- an engine error after the headers ---------------------------------------------------
$res = raw_response(raw_open($port, 'POST', '/v1/chat/completions', encode_json({
    model => 'demo', stream => JSON::PP::true,
    messages => [{ role => 'user', content => 'x' }],
    test_script => { content => 'abcdefgh', fail_after => 3,
                     step_ms => 100 } })), 5);
@ev = sse_read($res->{body});
is($res->{status}, 200, 'runner failure mid-stream: the stream had started');
is($ev[-1] && $ev[-1][1], '[DONE]', 'runner failure mid-stream: [DONE] last');
ok(@ev > 1 && eval { decode_json($ev[-2][1])->{error}{message} },
   'runner failure mid-stream: an error event');
ok(wait_for(sub { !healthy($na) }, 2), 'the failed engine is unhealthy');
stop_engine($pa);
$pa = start_engine($dir, $na, max_num_seqs => 2);
ok(wait_for(sub { healthy($na) }, 10), 'and readmitted after a restart');

# ---- metrics ---------------------------------------------------------------------
my $m = http('GET', "$base/metrics");
is($m->{status}, 200, '/metrics');
like($m->{headers}{'content-type'}, qr{^text/plain; version=0.0.4}, 'Prometheus text');
my $text = $m->{content};
like($text, qr/^llm_requests_total\{endpoint="chat_completions",status="200"\} \d+$/m,
     'requests by endpoint and status');
like($text, qr/^llm_requests_total\{endpoint="chat_completions",status="503"\} \d+$/m,
     '503s counted');
like($text, qr/^llm_engine_transitions_total\{engine="$na",to="unhealthy"\} [3-9]$/m,
     'transitions counted');
like($text, qr/^llm_engine_state\{engine="$na",state="healthy"\} 1$/m,
     'engine state gauge');
like($text, qr/^llm_time_to_first_token_seconds_bucket\{le="\+Inf"\} [1-9]\d*$/m,
     'TTFT histogram');
like($text, qr/^llm_inter_token_latency_seconds_count [1-9]\d*$/m, 'ITL histogram');
like($text, qr/^llm_queue_time_seconds_count [1-9]\d*$/m, 'queue time histogram');
like($text, qr/^llm_completion_tokens_total [1-9]\d*$/m, 'completion tokens');
like($text, qr/^llm_prompt_tokens_total [1-9]\d*$/m, 'prompt tokens');
like($text, qr/^llm_engine_kv_usage_ratio\{engine="$nb"\} \d+\.\d+$/m, 'KV usage');
like($text, qr/^llm_engine_kv_capacity_tokens\{engine="$nb"\} 65536$/m,
     'KV capacity from the engine header');
# the text format: one TYPE per family, a family's samples together
my (%typed, %done, $cur, @fmt);
for (split /\n/, $text) {
    if (/^# TYPE (\S+) (counter|gauge|histogram)$/) {
        push @fmt, "second TYPE for $1" if $typed{$1}++;
        next;
    }
    next if /^# HELP /;
    my ($name) = /^([a-z_]+)[{ ]/ or do { push @fmt, "bad line: $_"; next };
    $name =~ s/_(bucket|sum|count)$// unless $typed{$name};
    push @fmt, "untyped $name" unless $typed{$name};
    if (!defined $cur || $cur ne $name) {
        push @fmt, "$name is split" if $done{$name}++;
        $cur = $name;
    }
}
is_deeply(\@fmt, [], 'valid Prometheus text format');
my ($hb) = grep { $_->{name} eq $nb } @{ health()->{json}{engines} };
is($hb->{kv_capacity_tokens}, 65536, '/health reports the KV capacity');
like($text, qr/^llm_running 0$/m, 'running gauge');
like($text, qr/^llm_waiting 0$/m, 'waiting gauge');
like($text, qr/^llm_probes_total\{result="ok"\} [1-9]\d*$/m, 'probes counted');
like(`grep 'llm engine "$na": healthy -> unhealthy' $dir/logs/error.log`,
     qr/healthy -> unhealthy: \S/, 'transitions are logged with their reason');

stop_nginx($dir);
stop_engine($pa);
stop_engine($pb);
done_testing();
