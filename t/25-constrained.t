# Constrained decoding against the real stack: Debian's nginx with the
# module and the demo model (random weights, whose free text is never
# JSON) with the model runner.  json_object, json_schema (several
# schemas), forced tool calls (named: 20/20 valid; required), the Responses
# API's text.format and tool_choice, logit_bias, and the 400s.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http_json
               free_port engine_name start_engine stop_engine wait_for
               repo_root api_server raw_open raw_response sse_read);
use JSON::PP;
use Encode ();
use B ();

my $top = repo_root();
my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('cons');
my $pid = start_engine($dir, $name, model => "$top/tests/fixtures/demo",
                       served => 'tiny-demo', max_model_len => 2048,
                       max_num_seqs => 4,
                       extra => "kv_cache_memory_bytes: 64MiB");
my $server = api_server($port, [qw(chat_completions completions responses messages
                                   models tokenize health)]);
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=200ms passes=1;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http_json('GET', "$base/health")->{status} == 200 }, 30),
   'the demo engine is healthy behind nginx') or BAIL_OUT('not healthy');

sub post { http_json('POST', "$base$_[0]", encode_json($_[1])) }
my $user = [{ role => 'user', content => 'Answer in JSON.' }];
my $json = JSON::PP->new->allow_nonref;

# A validator for the schemas below: type, properties, required,
# additionalProperties false, items, minItems, maxItems, enum, const,
# anyOf, $ref into $defs.
sub valid {
    my ($root, $s, $v) = @_;
    return 1 unless defined $s;
    if (my $r = $s->{'$ref'}) {
        $r =~ s{^#/\$defs/}{} or return 0;
        return valid($root, $root->{'$defs'}{$r}, $v);
    }
    if (my $any = $s->{anyOf}) {
        for (@$any) { return 1 if valid($root, $_, $v) }
        return 0;
    }
    if (my $e = $s->{enum}) {
        my $t = $json->canonical->encode($v);
        return 0 unless grep { $json->canonical->encode($_) eq $t } @$e;
    }
    if (exists $s->{const}) {
        return 0 unless $json->canonical->encode($s->{const}) eq $json->canonical->encode($v);
    }
    my $type = $s->{type} // '';
    my @types = ref $type ? @$type : ($type);
    if ($type ne '') {
        my $okt = 0;
        for my $t (@types) {
            $okt ||= $t eq 'object' ? ref $v eq 'HASH'
                   : $t eq 'array' ? ref $v eq 'ARRAY'
                   : $t eq 'string' ? (defined $v && !ref $v && B::svref_2object(\$v)->FLAGS & B::SVp_POK())
                   : $t eq 'integer' ? (defined $v && !ref $v && $v =~ /^-?\d+$/)
                   : $t eq 'number' ? (defined $v && !ref $v && $v =~ /^-?\d/)
                   : $t eq 'boolean' ? JSON::PP::is_bool($v)
                   : $t eq 'null' ? !defined $v : 0;
        }
        return 0 unless $okt;
    }
    if (ref $v eq 'HASH') {
        for (@{ $s->{required} // [] }) { return 0 unless exists $v->{$_} }
        for my $k (keys %$v) {
            my $ps = $s->{properties}{$k};
            return 0 if !$ps && defined $s->{additionalProperties}
                        && !ref $s->{additionalProperties} && !$s->{additionalProperties};
            return 0 if $ps && !valid($root, $ps, $v->{$k});
        }
    }
    if (ref $v eq 'ARRAY') {
        return 0 if defined $s->{minItems} && @$v < $s->{minItems};
        return 0 if defined $s->{maxItems} && @$v > $s->{maxItems};
        for (@$v) { return 0 unless valid($root, $s->{items}, $_) }
    }
    return 1;
}

# ---- json_object -----------------------------------------------------------
my $free = post('/v1/chat/completions', { model => 'tiny-demo', messages => $user,
                                          max_tokens => 40, seed => 1 });
is($free->{status}, 200, 'unconstrained request');
ok(!eval { ref $json->decode($free->{json}{choices}[0]{message}{content}) eq 'HASH' },
   'the random model\'s free text is not a JSON object');

for my $seed (1 .. 5) {
    my $r = post('/v1/chat/completions',
                 { model => 'tiny-demo', messages => $user, max_tokens => 60, seed => $seed,
                   temperature => 1.0, response_format => { type => 'json_object' } });
    is($r->{status}, 200, "json_object seed $seed: 200") or diag($r->{content});
    my $c = $r->{json}{choices}[0]{message}{content};
    my $v = eval { $json->decode($c) };
    is(ref $v, 'HASH', "json_object seed $seed: content is a JSON object") or diag($c);
    is($r->{json}{choices}[0]{finish_reason}, 'stop', "json_object seed $seed: finish_reason stop");
    ok($r->{json}{usage}{completion_tokens} <= 60, "json_object seed $seed: within max_tokens");
}

# n > 1: every choice has its own matcher over the request's grammar
{
    my $r = post('/v1/chat/completions',
                 { model => 'tiny-demo', messages => $user, max_tokens => 60, seed => 7, n => 3,
                   temperature => 1.0, response_format => { type => 'json_object' } });
    is($r->{status}, 200, 'json_object n=3: 200') or diag($r->{content});
    my @ch = @{ $r->{json}{choices} // [] };
    is(scalar @ch, 3, 'json_object n=3: three choices');
    for my $c (@ch) {
        my $v = eval { $json->decode($c->{message}{content}) };
        is(ref $v, 'HASH', "json_object n=3: choice $c->{index} is a JSON object")
            or diag($c->{message}{content});
    }
}

# thinking: the reasoning is closed in time for the reply (tight budget)
for my $seed (1 .. 3) {
    my $r = post('/v1/chat/completions',
                 { model => 'tiny-demo', messages => $user, max_tokens => 12, seed => $seed,
                   chat_template_kwargs => { thinking => JSON::PP::true },
                   response_format => { type => 'json_object' } });
    my $m = $r->{json}{choices}[0]{message} // {};
    ok($r->{status} == 200 && ref eval { $json->decode($m->{content}) } eq 'HASH'
       && length($m->{reasoning_content} // '') > 0,
       "thinking, 12 tokens: reasoning, then a JSON object (seed $seed)") or diag($r->{content});
}

# ---- json_schema -------------------------------------------------------------
my @schemas = (
    { type => 'object', additionalProperties => JSON::PP::false,
      required => [qw(name age tags)],
      properties => { name => { type => 'string' }, age => { type => 'integer' },
                      tags => { type => 'array', items => { type => 'string' }, maxItems => 3 } } },
    { type => 'object', additionalProperties => JSON::PP::false,
      required => [qw(location unit days)],
      properties => {
        location => { type => 'object', additionalProperties => JSON::PP::false,
                      required => [qw(city country)],
                      properties => { city => { type => 'string' },
                                      country => { type => 'string', enum => [qw(FR DE JP)] } } },
        unit => { enum => ['celsius', 'fahrenheit'] },
        days => { type => 'array', minItems => 1, maxItems => 2,
                  items => { type => 'object', additionalProperties => JSON::PP::false,
                             required => [qw(day high)],
                             properties => { day => { type => 'integer' },
                                             high => { type => 'number' } } } } } },
    { '$defs' => { leaf => { type => 'object', required => ['kind', 'ok'],
                             additionalProperties => JSON::PP::false,
                             properties => { kind => { const => 'leaf' },
                                             ok => { type => ['boolean', 'null'] } } } },
      type => 'object', additionalProperties => JSON::PP::false, required => ['items'],
      properties => { items => { type => 'array', maxItems => 3,
                                 items => { anyOf => [ { '$ref' => '#/$defs/leaf' },
                                                       { type => 'integer' } ] } } } },
);
for my $i (0 .. $#schemas) {
    for my $seed (1 .. 3) {
        my $r = post('/v1/chat/completions',
                     { model => 'tiny-demo', messages => $user, max_tokens => 120, seed => $seed,
                       response_format => { type => 'json_schema',
                         json_schema => { name => "s$i", strict => JSON::PP::true,
                                          schema => $schemas[$i] } } });
        is($r->{status}, 200, "json_schema $i seed $seed: 200") or diag($r->{content});
        my $c = $r->{json}{choices}[0]{message}{content};
        my $v = eval { $json->decode($c) };
        ok($v && valid($schemas[$i], $schemas[$i], $v),
           "json_schema $i seed $seed: parses and validates") or diag($c);
    }
}

# vLLM's guided_json and structured_outputs.json
for my $f ([guided_json => $schemas[0]], [structured_outputs => { json => $schemas[0] }]) {
    my $r = post('/v1/chat/completions', { model => 'tiny-demo', messages => $user,
                                           max_tokens => 80, seed => 2, $f->[0] => $f->[1] });
    my $v = eval { $json->decode($r->{json}{choices}[0]{message}{content}) };
    ok($r->{status} == 200 && $v && valid($schemas[0], $schemas[0], $v), "$f->[0]: validates")
        or diag($r->{content});
}

# the Responses API: text.format
my $r = post('/v1/responses', { model => 'tiny-demo', input => 'JSON please', max_output_tokens => 120,
                                text => { format => { type => 'json_schema', name => 's1',
                                                      schema => $schemas[1], strict => JSON::PP::true } } });
is($r->{status}, 200, 'responses text.format: 200') or diag($r->{content});
my ($msg) = grep { $_->{type} eq 'message' } @{ $r->{json}{output} // [] };
my $v = eval { $json->decode($msg->{content}[0]{text}) };
ok($v && valid($schemas[1], $schemas[1], $v), 'responses text.format: validates')
    or diag($r->{content});

# ---- tool calls --------------------------------------------------------------
my $weather = { type => 'object', additionalProperties => JSON::PP::false,
                required => ['city', 'unit'],
                properties => { city => { type => 'string' },
                                unit => { type => 'string', enum => ['celsius', 'fahrenheit'] },
                                days => { type => 'integer' } } };
my $tools = [ { type => 'function', function => { name => 'get_weather', parameters => $weather } },
              { type => 'function', function => { name => 'get_time',
                  parameters => { type => 'object', properties => { tz => { type => 'string' } } } } } ];
my $good = 0;
for my $i (1 .. 20) {
    my $r = post('/v1/chat/completions',
                 { model => 'tiny-demo', messages => $user, max_tokens => 100, seed => $i,
                   tools => $tools,
                   tool_choice => { type => 'function', function => { name => 'get_weather' } } });
    my $calls = $r->{json}{choices}[0]{message}{tool_calls} // [];
    my $args = eval { $json->decode($calls->[0]{function}{arguments}) };
    if ($r->{status} == 200 && @$calls == 1 && $calls->[0]{function}{name} eq 'get_weather'
        && $args && valid($weather, $weather, $args)
        && $r->{json}{choices}[0]{finish_reason} eq 'tool_calls') {
        $good++;
    } else {
        diag("named call $i: $r->{content}");
    }
}
is($good, 20, 'tool_choice named: 20/20 calls to get_weather with valid arguments');

for my $seed (1 .. 3) {
    my $r = post('/v1/chat/completions',
                 { model => 'tiny-demo', messages => $user, max_tokens => 100, seed => $seed,
                   tools => $tools, tool_choice => 'required', parallel_tool_calls => JSON::PP::false });
    my $calls = $r->{json}{choices}[0]{message}{tool_calls} // [];
    ok($r->{status} == 200 && @$calls == 1 && $calls->[0]{function}{name} =~ /^get_(weather|time)$/
       && ref eval { $json->decode($calls->[0]{function}{arguments}) } eq 'HASH',
       "tool_choice required, parallel_tool_calls false: one call (seed $seed)") or diag($r->{content});
}

# auto: at most one call with parallel_tool_calls false; JSON or calls
# with a response_format
for my $seed (1 .. 3) {
    my $r = post('/v1/chat/completions',
                 { model => 'tiny-demo', messages => $user, max_tokens => 60, seed => $seed,
                   tools => $tools, parallel_tool_calls => JSON::PP::false });
    my $calls = $r->{json}{choices}[0]{message}{tool_calls} // [];
    ok($r->{status} == 200 && @$calls <= 1, "auto, parallel_tool_calls false: at most one call (seed $seed)")
        or diag($r->{content});
    $r = post('/v1/chat/completions',
              { model => 'tiny-demo', messages => $user, max_tokens => 60, seed => $seed,
                tools => $tools, response_format => { type => 'json_object' } });
    my $m = $r->{json}{choices}[0]{message} // {};
    ok($r->{status} == 200 && (@{ $m->{tool_calls} // [] }
                               || ref eval { $json->decode($m->{content}) } eq 'HASH'),
       "auto with json_object: a JSON object or tool calls (seed $seed)") or diag($r->{content});
}

# streamed, and with thinking: the constraint starts after </think>
{
    my $body = encode_json({ model => 'tiny-demo', messages => $user, max_tokens => 120, seed => 3,
                             stream => JSON::PP::true, tools => $tools,
                             chat_template_kwargs => { thinking => JSON::PP::true },
                             tool_choice => { type => 'function', function => { name => 'get_time' } } });
    my $s = raw_open($port, 'POST', '/v1/chat/completions', $body);
    my $resp = raw_response($s, 60);
    close $s;
    my ($name_seen, $args, $finish) = ('', '', '');
    for my $e (sse_read($resp->{body})) {
        next if $e->[1] eq '[DONE]';
        my $j = eval { decode_json($e->[1]) } or next;
        my $d = $j->{choices}[0]{delta} // {};
        for my $tc (@{ $d->{tool_calls} // [] }) {
            $name_seen .= $tc->{function}{name} // '';
            $args .= $tc->{function}{arguments} // '';
        }
        $finish = $j->{choices}[0]{finish_reason} // $finish;
    }
    is($name_seen, 'get_time', 'thinking + streamed named call: get_time');
    is(ref eval { $json->decode($args) }, 'HASH', 'thinking + streamed: arguments are an object');
    is($finish, 'tool_calls', 'thinking + streamed: finish_reason tool_calls');
}

# Responses API tool_choice
$r = post('/v1/responses', { model => 'tiny-demo', input => 'weather?', max_output_tokens => 100,
                             tools => [ { type => 'function', name => 'get_weather', parameters => $weather } ],
                             tool_choice => { type => 'function', name => 'get_weather' } });
my ($fc) = grep { $_->{type} eq 'function_call' } @{ $r->{json}{output} // [] };
ok($fc && $fc->{name} eq 'get_weather' && valid($weather, $weather, eval { $json->decode($fc->{arguments}) }),
   'responses tool_choice named: a valid get_weather call') or diag($r->{content});

# Anthropic's Messages API: tool_choice {type: tool} and {type: any} are
# the forced calls, as a tool_use block whose input validates
for my $tc ({ type => 'tool', name => 'get_weather' }, { type => 'any' }) {
    $r = post('/v1/messages', { model => 'tiny-demo', max_tokens => 100,
                                messages => [ { role => 'user', content => 'weather?' } ],
                                tools => [ { name => 'get_weather', input_schema => $weather } ],
                                tool_choice => $tc });
    my ($tu) = grep { $_->{type} eq 'tool_use' } @{ $r->{json}{content} // [] };
    ok($r->{status} == 200 && ($r->{json}{stop_reason} // '') eq 'tool_use' && $tu
       && $tu->{name} eq 'get_weather' && valid($weather, $weather, $tu->{input}),
       "messages tool_choice $tc->{type}: a tool_use block with valid input") or diag($r->{content});
}

# ---- logit_bias --------------------------------------------------------------
# -100: the greedy reply's tokens, banned, never appear (compared by their
# bytes: an id and its bytes are one-to-one in this byte-level vocabulary)
sub emitted {
    my ($r) = @_;
    return map { join('', map { chr } @{ $_->{bytes} }) } @{ $r->{json}{choices}[0]{logprobs}{content} // [] };
}
my %greedy = (model => 'tiny-demo', messages => $user, max_tokens => 30, seed => 9,
              temperature => 0, logprobs => JSON::PP::true);
my @seen = emitted(post('/v1/chat/completions', \%greedy));
my (%ban, %ban_bytes);
for my $t (@seen) {
    my $ids = post('/tokenize', { model => 'tiny-demo', prompt => Encode::decode('UTF-8', $t),
                                  add_special_tokens => JSON::PP::false })->{json}{tokens} // [];
    next unless @$ids == 1;
    $ban{$ids->[0]} = -100;
    $ban_bytes{$t} = 1;
}
ok(keys %ban >= 3, scalar(keys %ban) . ' tokens of the greedy reply to ban');
my $banned = post('/v1/chat/completions', { %greedy, logit_bias => \%ban });
is($banned->{status}, 200, 'logit_bias -100: 200') or diag($banned->{content});
my @out = emitted($banned);
ok(@out > 0, 'logit_bias -100: ' . scalar(@out) . ' tokens generated');
is(scalar(grep { $ban_bytes{$_} } @out), 0, 'logit_bias -100: no banned token is emitted');
my $force = post('/v1/completions', { model => 'tiny-demo', prompt => 'Hello', max_tokens => 12,
                                      temperature => 1.5, seed => 4, logit_bias => { 906 => 100 } });
my $ftok = post('/tokenize', { model => 'tiny-demo', prompt => $force->{json}{choices}[0]{text},
                               add_special_tokens => JSON::PP::false });
is_deeply($ftok->{json}{tokens}, [ (906) x 12 ], 'logit_bias +100: token 906 every time')
    or diag($force->{content});

# ---- errors ------------------------------------------------------------------
sub err_is {
    my ($body, $param, $re, $what) = @_;
    my $r = post('/v1/chat/completions', { model => 'tiny-demo', messages => $user, %$body });
    is($r->{status}, 400, "$what: 400");
    is($r->{json}{error}{param}, $param, "$what: param $param");
    like($r->{json}{error}{message}, $re, "$what: message") or diag($r->{content});
}
err_is({ logit_bias => { 999999 => 5 } }, 'logit_bias', qr/999999.*not in the vocabulary/, 'unknown id');
err_is({ logit_bias => { 5 => 101 } }, 'logit_bias', qr/-100 to 100/, 'bias out of range');
err_is({ logit_bias => { abc => 1 } }, 'logit_bias', qr/token ids/, 'bad key');
err_is({ response_format => { type => 'json_schema', json_schema => { name => 'x',
          schema => { type => 'string', pattern => 'a+' } } } },
       'response_format.json_schema.schema.pattern', qr/'pattern' is not supported/, 'unsupported keyword');
err_is({ response_format => { type => 'json_schema', json_schema => { name => 'x',
          schema => { type => 'object', properties => { a => { type => 'integer', minimum => 1 } } } } } },
       'response_format.json_schema.schema.properties.a.minimum', qr/'minimum' is not supported/,
       'nested unsupported keyword');
err_is({ guided_regex => 'a+' }, 'guided_regex', qr/not supported/, 'guided_regex');
err_is({ structured_outputs => { choice => ['a'] } }, 'structured_outputs', qr/only "json"/,
       'structured_outputs.choice');
err_is({ guided_json => { type => 'string', pattern => 'x' } },
       'response_format.json_schema.schema.pattern', qr/'pattern' is not supported/,
       'guided_json with an unsupported keyword');
{
    my $r = post('/v1/completions', { model => 'tiny-demo', prompt => 'x', guided_json => { type => 'object' } });
    is($r->{status}, 400, 'guided_json on completions: 400');
    is($r->{json}{error}{param}, 'guided_json', 'guided_json on completions: param');
}
err_is({ max_tokens => 3, tools => $tools,
         tool_choice => { type => 'function', function => { name => 'get_weather' } } },
       'max_tokens', qr/cannot hold the shortest reply.*at least \d+/, 'budget below the shortest call');

stop_nginx($dir);
stop_engine($pid);
done_testing();
