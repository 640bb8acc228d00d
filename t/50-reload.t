# nginx reload and worker crashes: a reload keeps the zone (health and
# promotions) and lets a running stream finish; a worker killed while it
# holds a slot and an admission place loses both (the engine frees the
# slot, the health leader reaps the place) and serving goes on.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http http_json
               free_port engine_name start_engine stop_engine engine_status
               wait_for raw_open raw_response sse_read nginx_bin api_server);
use JSON::PP;
use Time::HiRes qw(sleep time);

my $dir = scratch_dir();
my $port = free_port();
my ($na, $nb) = (engine_name('ra'), engine_name('rb'));
my $pa = start_engine($dir, $na, max_num_seqs => 1, slots => 8);
my $pb = start_engine($dir, $nb, max_num_seqs => 1, slots => 8);

my $server = api_server($port, [qw(chat_completions health admin)]);
write_conf($dir, <<"CONF");
    llm_engine $na run_dir=$dir;
    llm_engine $nb run_dir=$dir;
    llm_route demo $na $nb;
    llm_route only-a $na;
    llm_health interval=100ms passes=1;
    llm_test_script on;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
my $auth = { Authorization => 'Bearer sekrit' };

sub status { http_json('GET', "$base/admin/status", undef, $auth)->{json} }
sub running { my $s = status(); return $s->{engines}[0]{running} + $s->{engines}[1]{running} }
sub workers {
    my $master = `cat $dir/nginx.pid`;
    chomp $master;
    return grep { /^\d+$/ } map { s/\s//gr } `pgrep -P $master`;
}
sub chat {
    my (%script) = @_;
    return encode_json({ model => 'demo', stream => JSON::PP::true,
                         messages => [{ role => 'user', content => 'x' }],
                         test_script => \%script });
}

ok(wait_for(sub { my $s = status(); $s && 2 == grep { $_->{state} eq 'healthy' } @{ $s->{engines} } }, 10),
   'both engines healthy') or BAIL_OUT('engines never became healthy');

# the pool balances by least outstanding sequences: two at once use both
my @s = map { raw_open($port, 'POST', '/v1/chat/completions',
                       chat(content => 'abc', step_ms => 100)) } 1 .. 2;
my %fp;
for (@s) {
    my $r = raw_response($_, 10);
    $fp{$1}++ while $r->{body} =~ /"system_fingerprint":"([^"]+)"/g;
    close $_;
}
is(scalar keys %fp, 2, 'two concurrent requests ran on the two engines');

# FIFO per engine, not across pools: a request that can run on a free
# engine does not wait behind one queued for a busy engine
sub chat_to {
    my ($model, %script) = @_;
    return encode_json({ model => $model,
                         messages => [{ role => 'user', content => 'x' }],
                         test_script => \%script });
}
my $busy = raw_open($port, 'POST', '/v1/chat/completions',
                    chat_to('only-a', content => 'abcdefghij', step_ms => 150));
ok(wait_for(sub { status()->{engines}[0]{running} == 1 }, 5), 'a is busy');
my $behind = raw_open($port, 'POST', '/v1/chat/completions',
                      chat_to('only-a', content => 'later'));
ok(wait_for(sub { status()->{waiting} == 1 }, 5), 'a request waits for a');
my $r = http_json('POST', "$base/v1/chat/completions",
                  chat_to('demo', content => 'now'));
is($r->{json}{system_fingerprint}, "fp_scripted_$nb",
   'a request for the pool runs on b at once');
is(status()->{waiting}, 1, 'while the other still waits for a');
is(raw_response($busy, 10)->{status}, 200, 'the long one finishes');
is(raw_response($behind, 10)->{status}, 200, 'then the queued one runs');
close $_ for $busy, $behind;

is(http_json('POST', "$base/admin/promote?route=demo&engine=$nb", '', $auth)->{status},
   200, 'promote demo to b');

# ---- reload during a stream ------------------------------------------------
my $stream = raw_open($port, 'POST', '/v1/chat/completions',
                      chat(content => 'abcdefghij', step_ms => 100));
sleep 0.3;
my @old = sort(workers());
my $bin = nginx_bin();
system("$bin -p $dir -c $dir/nginx.conf -s reload 2>/dev/null");
ok(wait_for(sub { my @w = sort(workers()); "@w" ne "@old" && @w >= 2 }, 5),
   'new workers after reload');
my $res = raw_response($stream, 10);
close $stream;
my @ev = sse_read($res->{body});
is($ev[-1][1], '[DONE]', 'the stream running during the reload finished');
is(join('', map { /"content":"(\w)"/ ? $1 : '' } map { $_->[1] } @ev),
   'abcdefghij', 'with every token');

my $st = status();
my ($route) = grep { $_->{model} eq 'demo' } @{ $st->{routes} };
is_deeply($route->{engines}, [$nb], 'the promotion survived the reload');
is(scalar(grep { $_->{state} eq 'healthy' } @{ $st->{engines} }), 2,
   'health survived the reload');
ok(wait_for(sub { running() == 0 }, 5), 'no admission place left over');

# ---- a worker dies holding a slot --------------------------------------------
my $before = engine_status($dir, $nb)->{requests_cancelled};
$stream = raw_open($port, 'POST', '/v1/chat/completions',
                   chat(content => 'x' x 100, step_ms => 100));
ok(wait_for(sub { running() == 1 }, 5), 'a request is running');
kill 'KILL', workers();
close $stream;
ok(wait_for(sub { scalar(workers()) >= 2 }, 5), 'the master respawns workers');
ok(wait_for(sub { my $r = eval { running() }; defined $r && $r == 0 }, 5),
   'the dead worker\'s admission place is reaped');
ok(wait_for(sub { engine_status($dir, $nb)->{slot_states}{free} == 8 }, 5),
   'and the engine freed its slot');
ok(engine_status($dir, $nb)->{requests_cancelled} > $before,
   'cancelling the sequence');
like(`cat $dir/logs/error.log`, qr/released 1 admission places held by workers that exited/,
     'the reap is logged');
$res = http_json('POST', "$base/v1/chat/completions", encode_json({
    model => 'demo', messages => [{ role => 'user', content => 'x' }],
    test_script => { content => 'fine' } }));
is($res->{json}{choices}[0]{message}{content}, 'fine', 'serving goes on');

stop_nginx($dir);
stop_engine($pa);
stop_engine($pb);
done_testing();
