# Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens):
# the conversion to the canonical chat request (read from the debug log),
# the message object and the SSE events against a real engine (scripted
# test runner), and Anthropic's error shape.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx http http_json free_port
               engine_name start_engine wait_for raw_open raw_response
               sse_read api_server);
use JSON::PP;

my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('anth');
start_engine($dir, $name, max_num_seqs => 4);
my $server = api_server($port, [qw(messages count_tokens health)]);
write_conf($dir, <<"CONF", log_level => 'debug');
    llm_engine $name run_dir=$dir;
    llm_health interval=100ms passes=1;
    llm_test_script on;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 10),
   'engine becomes healthy') or BAIL_OUT('engine never became healthy');

my ($t, $f) = (JSON::PP::true, JSON::PP::false);
my $n = 0;

sub post {
    my ($path, $body, $id) = @_;
    return http_json('POST', "$base$path", encode_json($body),
                     $id ? { 'X-Request-Id' => $id } : undef);
}

# the canonical request the engine got for request $id
sub canonical {
    my ($id) = @_;
    open my $fh, '<', "$dir/logs/error.log" or die $!;
    my ($line) = grep { /llm request \Q$id\E: / } <$fh>;
    my ($json) = ($line // '') =~ /llm request \Q$id\E: (\{.*\})/;
    my $c = eval { decode_json($json) } or return undef;
    delete $c->{id};
    delete $c->{test_script};
    return $c;
}

sub stream {
    my ($body) = @_;
    my $s = raw_open($port, 'POST', '/v1/messages', encode_json($body));
    my $r = raw_response($s, 15);
    close $s;
    $r->{events} = [ map { [$_->[0], decode_json($_->[1])] }
                     sse_read($r->{body}) ];
    return $r;
}

my $user = [{ role => 'user', content => 'hi' }];

# ---- conversion ------------------------------------------------------------
my $r = post('/v1/messages', {
    model => 'demo', max_tokens => 3000, system => 'Be brief.',
    temperature => 0.5, top_p => 0.9, top_k => 20, stop_sequences => ['END'],
    metadata => { user_id => 'u' },
    messages => [
        { role => 'user', content => 'What is the weather?' },
        { role => 'assistant', content => [
            { type => 'thinking', thinking => 'Need a tool.', signature => 's' },
            { type => 'text', text => 'Checking.' },
            { type => 'tool_use', id => 'toolu_1', name => 'get_weather',
              input => { city => 'Paris' } }] },
        { role => 'user', content => [
            { type => 'tool_result', tool_use_id => 'toolu_1',
              content => 'sunny' },
            { type => 'tool_result', tool_use_id => 'toolu_2', is_error => $t,
              content => [{ type => 'text', text => 'timeout' }] },
            { type => 'text', text => 'Thanks', cache_control => {} }] }],
    tools => [{ name => 'get_weather', description => 'Weather',
                input_schema => { type => 'object', properties => {
                    city => { type => 'string' } } } }],
    tool_choice => { type => 'auto', disable_parallel_tool_use => $t },
    thinking => { type => 'enabled', budget_tokens => 2048 },
    test_script => { content => 'ok' } }, 'anth-conv');
is($r->{status}, 200, 'conversion request: 200') or diag($r->{content});
is_deeply(canonical('anth-conv'), {
    kind => 'chat', model => 'demo',
    messages => [
        { role => 'system', content => 'Be brief.' },
        { role => 'user', content => 'What is the weather?' },
        { role => 'assistant',
          content => [{ type => 'text', text => 'Checking.' }],
          reasoning_content => 'Need a tool.',
          tool_calls => [{ id => 'toolu_1', type => 'function',
                           function => { name => 'get_weather',
                                         arguments => '{"city":"Paris"}' } }] },
        { role => 'tool', tool_call_id => 'toolu_1', content => 'sunny' },
        { role => 'tool', tool_call_id => 'toolu_2',
          content => [{ type => 'text', text => 'Error:' },
                      { type => 'text', text => 'timeout' }] },
        { role => 'user', content => [{ type => 'text', text => 'Thanks' }] }],
    tools => [{ type => 'function', function => {
        name => 'get_weather', description => 'Weather',
        parameters => { type => 'object', properties => {
            city => { type => 'string' } } } } }],
    tool_choice => 'auto', parallel_tool_calls => $f,
    chat_template_kwargs => { thinking => $t }, reasoning_effort => 'low',
    max_tokens => 3000, temperature => 0.5, top_p => 0.9, top_k => 20,
    stop => ['END'] },
  'system, blocks, tool_use / tool_result, tools, thinking -> chat');

my %choice = (any => 'required', none => 'none',
              tool => { type => 'function',
                        function => { name => 'get_weather' } });
for my $type (sort keys %choice) {
    my $id = 'anth-choice-' . $type;
    post('/v1/messages', { model => 'demo', max_tokens => 5, messages => $user,
         tools => [{ name => 'get_weather', input_schema => {} }],
         tool_choice => { type => $type, name => 'get_weather' },
         test_script => { content => 'ok' } }, $id);
    is_deeply(canonical($id)->{tool_choice}, $choice{$type},
              "tool_choice $type");
}

for my $case ([1024, 'low'], [8191, 'low'], [8192, 'high'], [32767, 'high'],
              [32768, 'max']) {
    my $id = 'anth-budget-' . $case->[0];
    post('/v1/messages', { model => 'demo', max_tokens => 40000,
         messages => $user, test_script => { content => 'ok' },
         thinking => { type => 'enabled', budget_tokens => $case->[0] } },
         $id);
    is(canonical($id)->{reasoning_effort}, $case->[1],
       "budget_tokens $case->[0] -> $case->[1]");
}
post('/v1/messages', { model => 'demo', max_tokens => 5, messages => $user,
     system => [{ type => 'text', text => 'a' }, { type => 'text', text => 'b' }],
     thinking => { type => 'disabled' }, test_script => { content => 'ok' } },
     'anth-sys');
my $c = canonical('anth-sys');
is_deeply($c->{messages}[0], { role => 'system', content => [
    { type => 'text', text => 'a' }, { type => 'text', text => 'b' }] },
    'system blocks -> text parts');
is_deeply($c->{chat_template_kwargs}, { thinking => $f }, 'thinking disabled');

# ---- the message object ------------------------------------------------------
my %script = (reasoning => 'Think.', content => 'Hello!',
              tool_calls => [{ id => 'toolu_7', name => 'get_weather',
                               arguments => '{"city":"Paris"}' }]);
$r = post('/v1/messages', { model => 'demo', max_tokens => 100,
                            messages => $user, test_script => \%script });
is($r->{status}, 200, 'message: 200') or diag($r->{content});
my $j = $r->{json};
like($j->{id}, qr/^msg_[0-9a-f]{32}$/, 'id msg_...');
is($j->{type}, 'message', 'type message');
is($j->{role}, 'assistant', 'role');
is($j->{model}, 'demo', 'model');
is_deeply($j->{content}, [
    { type => 'thinking', thinking => 'Think.', signature => '' },
    { type => 'text', text => 'Hello!' },
    { type => 'tool_use', id => 'toolu_7', name => 'get_weather',
      input => { city => 'Paris' } }], 'content blocks');
is($j->{stop_reason}, 'tool_use', 'stop_reason tool_use');
is($j->{stop_sequence}, undef, 'stop_sequence null');
is($j->{usage}{input_tokens}, 2, 'usage.input_tokens');
is($j->{usage}{output_tokens}, 6 + 6 + 16, 'usage.output_tokens');

$r = post('/v1/messages', { model => 'demo', max_tokens => 3,
                            messages => $user,
                            test_script => { content => 'Hello there' } });
is($r->{json}{stop_reason}, 'max_tokens', 'length -> max_tokens');
is_deeply($r->{json}{content}, [{ type => 'text', text => 'Hel' }],
          'text cut at max_tokens');
$r = post('/v1/messages', { model => 'demo', max_tokens => 30,
                            messages => $user,
                            test_script => { content => 'Hi' } });
is($r->{json}{stop_reason}, 'end_turn', 'stop -> end_turn');

# ---- streaming -------------------------------------------------------------
$r = stream({ model => 'demo', max_tokens => 100, messages => $user,
              stream => $t, test_script => \%script });
is($r->{status}, 200, 'stream: 200');
is($r->{headers}{'content-type'}, 'text/event-stream', 'stream: SSE');
my @ev = @{ $r->{events} };
is(scalar(grep { $_->[0] eq $_->[1]{type} } @ev), scalar @ev,
   'every event: its type repeated in data');
my @types = map { $_->[0] } @ev;
is($types[0], 'message_start', 'message_start first');
is($types[1], 'ping', 'then a ping');
is_deeply([@types[-2, -1]], ['message_delta', 'message_stop'],
          'message_delta, message_stop last');
my $start = $ev[0][1]{message};
like($start->{id}, qr/^msg_[0-9a-f]{32}$/, 'message_start: id');
is_deeply($start->{content}, [], 'message_start: no content yet');
is($start->{usage}{input_tokens}, 2, 'message_start: input_tokens already');
is($start->{usage}{output_tokens}, 0, 'message_start: no output tokens yet');
my (@blocks, %text);
for my $e (@ev) {
    my $d = $e->[1];
    if ($e->[0] eq 'content_block_start') {
        is($d->{index}, scalar @blocks, "block $d->{index} starts in order");
        push @blocks, $d->{content_block};
    } elsif ($e->[0] eq 'content_block_delta') {
        is($d->{index}, $#blocks, 'delta for the open block');
        my $dl = $d->{delta};
        $text{$d->{index}} .= $dl->{thinking} // $dl->{text}
                              // $dl->{partial_json};
        push @{ $blocks[$d->{index}]{deltas} }, $dl->{type};
    } elsif ($e->[0] eq 'content_block_stop') {
        is($d->{index}, $#blocks, 'stop for the open block');
        $blocks[$d->{index}]{stopped} = 1;
    }
}
is(scalar @blocks, 3, 'three blocks');
is($blocks[0]{type}, 'thinking', 'block 0 thinking');
is($text{0}, 'Think.', 'thinking_delta text');
is($blocks[1]{type}, 'text', 'block 1 text');
is($text{1}, 'Hello!', 'text_delta text');
is_deeply([ @{$blocks[2]}{qw(type id name)} ],
          ['tool_use', 'toolu_7', 'get_weather'], 'block 2 tool_use');
is_deeply($blocks[2]{input}, {}, 'tool_use starts with empty input');
is_deeply(decode_json($text{2}), { city => 'Paris' },
          'input_json_delta parts join to the input');
is_deeply([ map { my %u; @u{@{ $_->{deltas} }} = (); [keys %u] } @blocks ],
          [['thinking_delta'], ['text_delta'], ['input_json_delta']],
          'delta types');
is(scalar(grep { $_->{stopped} } @blocks), 3, 'every block stopped');
my $md = $ev[-2][1];
is($md->{delta}{stop_reason}, 'tool_use', 'message_delta: stop_reason');
is($md->{usage}{output_tokens}, 28, 'message_delta: output_tokens');
is($md->{usage}{input_tokens}, 2, 'message_delta: input_tokens');

# ---- count_tokens ----------------------------------------------------------
$r = post('/v1/messages/count_tokens', { model => 'demo', messages => $user,
                                         system => 'abc' }, 'anth-count');
is($r->{status}, 200, 'count_tokens: 200') or diag($r->{content});
is_deeply($r->{json}, { input_tokens => 5 },
          'count_tokens: {input_tokens} (system and user text)');
is(canonical('anth-count')->{kind}, 'tokenize', 'count_tokens: tokenize');

# ---- errors ----------------------------------------------------------------
sub error_is {
    my ($body, $status, $re, $what) = @_;
    my $r = post('/v1/messages', $body);
    is($r->{status}, $status, "$what: $status");
    is($r->{json}{type}, 'error', "$what: type error");
    is($r->{json}{error}{type}, $status == 404 ? 'not_found_error'
                                               : 'invalid_request_error',
       "$what: error type");
    like($r->{json}{error}{message}, $re, "$what: message");
}
error_is({ model => 'demo', messages => $user }, 400,
         qr/^max_tokens: Field required/, 'no max_tokens');
error_is({ model => 'demo', max_tokens => 5, messages => [] }, 400,
         qr/^messages: a non-empty array/, 'empty messages');
error_is({ model => 'demo', max_tokens => 5,
           messages => [{ role => 'system', content => 'x' }] }, 400,
         qr/^messages\.0\.role: must be "user" or "assistant"/, 'system role');
error_is({ model => 'demo', max_tokens => 5, messages => [{ role => 'user',
           content => [{ type => 'image', source => {} }] }] }, 400,
         qr/^messages\.0\.content\.0\.type: "image" blocks are not supported/,
         'image block');
error_is({ model => 'demo', max_tokens => 5, messages => [
           @$user, { role => 'assistant', content => 'Sure' }] }, 400,
         qr/^messages\.1: a final assistant turn \(prefill\) is not supported/,
         'prefill');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           tools => [{ name => 'x' }] }, 400,
         qr/^tools\.0\.input_schema: an object is required/, 'no input_schema');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           tools => [{ type => 'web_search_20250305', name => 'web_search' }] },
         400, qr/^tools\.0\.type: only client tools/, 'server tool');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           mcp_servers => [{ type => 'url', url => 'https://x', name => 'x' }] },
         400, qr/^mcp_servers: MCP connectors are not supported/, 'MCP connector');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           container => 'c1' }, 400,
         qr/^container: code execution containers are not supported/, 'container');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           tool_choice => { type => 'tool' } }, 400,
         qr/^tool_choice\.name: a string is required/, 'tool without name');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           tool_choice => { type => 'tool', name => 'x' } }, 400,
         qr/^tool_choice names function "x" which is not in tools/,
         'tool_choice naming an unknown tool (the chat validator)');
error_is({ model => 'demo', max_tokens => 2000, messages => $user,
           thinking => { type => 'enabled', budget_tokens => 2000 } }, 400,
         qr/^max_tokens must be greater than thinking\.budget_tokens/,
         'budget over max_tokens');
error_is({ model => 'demo', max_tokens => 5000, messages => $user,
           thinking => { type => 'enabled', budget_tokens => 100 } }, 400,
         qr/^thinking\.budget_tokens: must be >= 1024/, 'budget too small');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           temperature => 'hot' }, 400, qr/^temperature /,
         'a bad sampling field (the chat validator)');
error_is({ model => 'demo', max_tokens => 5, messages => $user,
           stop_sequences => 'END' }, 400,
         qr/^stop_sequences: must be an array of strings/, 'stop_sequences');
error_is({ model => 'nope', max_tokens => 5, messages => $user }, 404,
         qr/the model "nope" does not exist/, 'unknown model');
$r = http_json('POST', "$base/v1/messages", '{"model":');
is($r->{status}, 400, 'malformed JSON: 400');
is($r->{json}{type}, 'error', 'malformed JSON: Anthropic shape');
$r = http_json('GET', "$base/v1/messages");
is($r->{status}, 405, 'GET: 405');
is($r->{json}{error}{type}, 'invalid_request_error', '405: Anthropic shape');

# an engine error before the headers, and one in the stream
$r = post('/v1/messages', { model => 'demo', max_tokens => 5, messages => $user,
          test_script => { error => { status => 400,
                                      code => 'context_length_exceeded',
                                      message => 'too long' } } });
is($r->{status}, 400, 'engine 400: 400');
is_deeply($r->{json}, { type => 'error', error => {
    type => 'invalid_request_error', message => 'too long' } },
    'engine 400: Anthropic shape');
$r = stream({ model => 'demo', max_tokens => 50, messages => $user,
              stream => $t, test_script => { content => 'abcdef',
                                             fail_after => 3,
                                             step_ms => 100 } });
is($r->{events}[-1][0], 'error', 'a failure mid-stream: event error');
is($r->{events}[-1][1]{error}{type}, 'api_error', 'mid-stream: api_error');

done_testing();
