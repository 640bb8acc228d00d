# n > 1 through nginx with the demo model (tests/fixtures/demo, CPU): one
# request, n sequences in the engine each with its own seed stream (choice
# i is what n = 1 with seed + i gives), choices indexed 0..n-1, streams
# interleaved by index, usage over all choices, limits, and n counted as n
# sequences by admission.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(repo_root scratch_dir write_conf start_nginx http http_json
               free_port engine_name start_engine wait_for raw_open
               raw_response sse_read api_server);
use JSON::PP;

my $top = repo_root();
my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('choices');
start_engine($dir, $name, model => "$top/tests/fixtures/demo",
             max_model_len => 4096, max_num_seqs => 4,
             extra => "kv_cache_memory_bytes: 64MiB");
my $server = api_server($port, [qw(chat_completions completions health
                                   messages)]);
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=100ms passes=1;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 20),
   'engine with the demo model becomes healthy')
    or BAIL_OUT('engine never became healthy');

my $true = JSON::PP::true;
my $user = [{ role => 'user', content => 'Tell me a story.' }];
my %gen = (model => 'demo', max_tokens => 8, temperature => 1.0,
           ignore_eos => $true);
sub post { http_json('POST', "$base$_[0]", encode_json($_[1])) }

# ---- chat, not streamed ----------------------------------------------------
my @want = map {
    post('/v1/chat/completions', { %gen, messages => $user, seed => 7 + $_ })
        ->{json}{choices}[0]{message}{content}
} 0 .. 2;
my $r = post('/v1/chat/completions', { %gen, messages => $user, seed => 7,
                                      n => 3 });
is($r->{status}, 200, 'n=3: 200') or diag($r->{content});
my $c = $r->{json}{choices};
is(scalar @$c, 3, 'n=3: three choices');
is_deeply([ map { $_->{index} } @$c ], [0, 1, 2], 'indexed 0..2');
is_deeply([ map { $_->{message}{content} } @$c ], \@want,
          'choice i is the text of seed 7 + i');
isnt($want[0], $want[1], 'the choices differ');
is_deeply([ map { $_->{finish_reason} } @$c ], [('length') x 3],
          'each choice has its finish_reason');
is($r->{json}{usage}{completion_tokens}, 24, 'usage counts all 3 x 8 tokens');
is($r->{json}{usage}{total_tokens},
   $r->{json}{usage}{prompt_tokens} + 24, 'the prompt counts once');

# ---- chat, streamed: chunks interleaved by index ------------------------------
my $s = raw_open($port, 'POST', '/v1/chat/completions', encode_json({
    %gen, messages => $user, seed => 7, n => 3, stream => $true,
    stream_options => { include_usage => $true } }));
$r = raw_response($s, 30);
close $s;
my @ev = sse_read($r->{body});
is($ev[-1][1], '[DONE]', 'stream: [DONE] last');
my @chunks = map { decode_json($_->[1]) } @ev[0 .. $#ev - 1];
my (%text, %role, %finish, @order, $usage);
for my $ch (@chunks) {
    $usage = $ch->{usage} if $ch->{usage};
    for my $choice (@{ $ch->{choices} }) {
        my $i = $choice->{index};
        push @order, $i;
        $role{$i}++ if $choice->{delta}{role};
        $text{$i} .= $choice->{delta}{content} // '';
        $finish{$i} = $choice->{finish_reason} if $choice->{finish_reason};
    }
}
is_deeply([ map { $text{$_} } 0 .. 2 ], \@want,
          'stream: per-index text equals the choices');
is_deeply(\%role, { 0 => 1, 1 => 1, 2 => 1 }, 'stream: one role delta each');
is_deeply(\%finish, { 0 => 'length', 1 => 'length', 2 => 'length' },
          'stream: a finish_reason chunk per index');
my %seen;
my $interleaved = grep { $seen{$_}++ ; keys(%seen) > 1 && $_ == 0 } @order;
ok($interleaved, 'stream: indexes interleave (the choices run together)');
is($usage->{completion_tokens}, 24, 'stream: usage counts all choices');

# ---- completions ------------------------------------------------------------
$r = post('/v1/completions', { %gen, prompt => 'Once upon a time', seed => 3,
                               n => 2 });
is($r->{status}, 200, 'completions n=2: 200') or diag($r->{content});
is_deeply([ map { $_->{index} } @{ $r->{json}{choices} } ], [0, 1],
          'completions: two choices');
is($r->{json}{choices}[1]{text},
   post('/v1/completions', { %gen, prompt => 'Once upon a time', seed => 4 })
       ->{json}{choices}[0]{text}, 'completions: choice 1 is seed + 1');
is($r->{json}{usage}{completion_tokens}, 16, 'completions: usage');

# ---- limits ------------------------------------------------------------------
for my $case ([17, qr/^n must be between 1 and 16, got 17/],
              [0, qr/^n must be between 1 and 16, got 0/]) {
    $r = post('/v1/chat/completions', { %gen, messages => $user,
                                        n => $case->[0] });
    is($r->{status}, 400, "n=$case->[0]: 400");
    is($r->{json}{error}{param}, 'n', "n=$case->[0]: param n");
    like($r->{json}{error}{message}, $case->[1], "n=$case->[0]: message");
}
$r = post('/v1/chat/completions', { %gen, messages => $user, n => 5 });
is($r->{status}, 400, 'n over max_num_seqs: 400 from the engine');
like($r->{json}{error}{message}, qr/at most 4 sequences/, 'and says the limit');
is(post('/v1/completions', { %gen, prompt => 'x', n => 2, best_of => 3 })
   ->{status}, 400, 'best_of stays 1');

# ---- Anthropic stop_sequence (the engine names the stop string) -------------
my %greedy = (model => 'demo', max_tokens => 12, temperature => 0,
              messages => $user);
my $text = post('/v1/messages', \%greedy)->{json}{content}[0]{text};
my $k = int(length($text) / 2);
my $stop = substr($text, $k, 2);
my $before = substr($text, 0, index($text, $stop));
$r = post('/v1/messages', { %greedy, stop_sequences => ["\x01never", $stop] });
is($r->{json}{stop_reason}, 'stop_sequence', 'messages: stop_reason stop_sequence');
is($r->{json}{stop_sequence}, $stop, 'messages: the stop sequence that matched');
is($r->{json}{content}[0]{text}, $before, 'messages: text ends before it');
$r = post('/v1/messages', \%greedy);
is($r->{json}{stop_sequence}, undef, 'no stop sequence: null');
$s = raw_open($port, 'POST', '/v1/messages', encode_json({
    %greedy, stop_sequences => [$stop], stream => $true }));
$r = raw_response($s, 30);
close $s;
my ($md) = grep { $_->[0] eq 'message_delta' } sse_read($r->{body});
is_deeply(decode_json($md->[1])->{delta},
          { stop_reason => 'stop_sequence', stop_sequence => $stop },
          'messages stream: message_delta names the stop sequence');

# ---- admission counts n ----------------------------------------------------------
sub running {
    my $h = http_json('GET', "$base/health")->{json};
    return $h->{engines}[0]{running};
}
$s = raw_open($port, 'POST', '/v1/chat/completions', encode_json({
    %gen, messages => $user, n => 3, max_tokens => 3000, stream => $true }));
my $first = '';
wait_for(sub { sysread($s, $first, 4096, length $first); length $first }, 10);
is(running(), 3, 'a running n=3 request holds 3 of max_num_seqs');
close $s;
ok(wait_for(sub { running() == 0 }, 10), 'and gives all 3 back');

done_testing();
