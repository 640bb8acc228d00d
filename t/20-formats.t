# Response formats against a real engine (llm-engine serve, scripted test
# runner): chat, completions, responses, tokenize, detokenize; streamed and
# not; reasoning and tool-call flows; engine errors before the headers.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http http_json
               free_port engine_name start_engine stop_engine wait_for
               raw_open raw_response sse_read api_server);
use JSON::PP;
use Time::HiRes qw(time);

my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('fmt');
my $epid = start_engine($dir, $name, max_num_seqs => 4);

my $server = api_server($port, [qw(chat_completions completions responses
                                   models tokenize detokenize health)]);
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=100ms passes=1;
    llm_test_script on;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 10),
   'engine becomes healthy') or BAIL_OUT('engine never became healthy');

sub post { http_json('POST', "$base$_[0]", encode_json($_[1])) }

sub stream {
    my ($path, $body) = @_;
    my $s = raw_open($port, 'POST', $path, encode_json($body));
    my $r = raw_response($s, 15);
    close $s;
    $r->{events} = [ sse_read($r->{body}) ];
    return $r;
}

my $user = [{ role => 'user', content => 'hi' }];
my %script = (reasoning => 'Think.', content => 'Hello!',
              tool_calls => [{ id => 'call_7', name => 'get_weather',
                               arguments => '{"city":"Paris"}' }]);
my $true = JSON::PP::true;

# ---- models --------------------------------------------------------------
my $m = http_json('GET', "$base/v1/models");
is($m->{status}, 200, '/v1/models');
is($m->{json}{object}, 'list', 'models: list');
is($m->{json}{data}[0]{id}, 'demo', 'served name from the engine header');
is($m->{json}{data}[0]{max_model_len}, 4096, 'max_model_len');
is($m->{json}{data}[0]{object}, 'model', 'model object');

# ---- chat, not streamed ----------------------------------------------------
my $r = post('/v1/chat/completions',
             { model => 'demo', messages => $user, test_script => \%script });
is($r->{status}, 200, 'chat: 200') or diag($r->{content});
my $j = $r->{json};
like($j->{id}, qr/^chatcmpl-[0-9a-f]{32}$/, 'chat: id');
is($j->{object}, 'chat.completion', 'chat: object');
like($j->{created}, qr/^\d{10}$/, 'chat: created');
is($j->{model}, 'demo', 'chat: model');
is($j->{system_fingerprint}, "fp_scripted_$name", 'chat: system_fingerprint');
my $msg = $j->{choices}[0]{message};
is($msg->{role}, 'assistant', 'chat: role');
is($msg->{content}, 'Hello!', 'chat: content');
is($msg->{reasoning_content}, 'Think.', 'chat: reasoning_content');
is_deeply($msg->{tool_calls}, [{ id => 'call_7', type => 'function',
    function => { name => 'get_weather', arguments => '{"city":"Paris"}' } }],
    'chat: tool_calls');
is($j->{choices}[0]{finish_reason}, 'tool_calls', 'chat: finish_reason');
is($j->{choices}[0]{index}, 0, 'chat: index');
my $u = $j->{usage};
is($u->{prompt_tokens}, 2, 'chat: prompt_tokens');
is($u->{completion_tokens}, 6 + 6 + 16, 'chat: completion_tokens');
is($u->{total_tokens}, $u->{prompt_tokens} + $u->{completion_tokens},
   'chat: total_tokens');
is($u->{completion_tokens_details}{reasoning_tokens}, 6,
   'chat: reasoning_tokens');
is($u->{prompt_tokens_details}{cached_tokens}, 0, 'chat: cached_tokens');
like($r->{headers}{'x-request-id'}, qr/^[0-9a-f]{32}$/, 'chat: X-Request-Id');
is($r->{headers}{'content-type'}, 'application/json', 'chat: content type');

$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
          test_script => { content => '', tool_calls => $script{tool_calls} } });
ok(exists $r->{json}{choices}[0]{message}{content}
   && !defined $r->{json}{choices}[0]{message}{content},
   'chat: content is null with only a tool call');

$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
          test_script => { content => 'Plain.' } });
$msg = $r->{json}{choices}[0]{message};
is($msg->{content}, 'Plain.', 'plain chat: content');
ok(!defined $msg->{reasoning_content}, 'plain chat: no reasoning');
ok(!exists $msg->{tool_calls}, 'plain chat: no tool_calls');
is($r->{json}{choices}[0]{finish_reason}, 'stop', 'plain chat: stop');

$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
          max_completion_tokens => 3, test_script => { content => 'abcdef' } });
is($r->{json}{choices}[0]{message}{content}, 'abc',
   'max_completion_tokens reaches the engine');
is($r->{json}{choices}[0]{finish_reason}, 'length', 'finish_reason length');

$r = post('/v1/chat/completions', { model => 'demo', test_script => {},
          messages => [{ role => 'system', content => 'ab' },
                       { role => 'user', content => [
                           { type => 'text', text => 'cd' },
                           { type => 'text', text => 'e' }] }] });
is($r->{json}{usage}{prompt_tokens}, 5,
   'canonical messages keep every content part');

# ---- chat, streamed --------------------------------------------------------
$r = stream('/v1/chat/completions', { model => 'demo', messages => $user,
            stream => $true, stream_options => { include_usage => $true },
            test_script => \%script });
is($r->{status}, 200, 'chat stream: 200');
is($r->{headers}{'content-type'}, 'text/event-stream', 'chat stream: SSE');
is($r->{headers}{'x-accel-buffering'}, 'no', 'chat stream: no buffering');
my @ev = @{ $r->{events} };
is($ev[-1][1], '[DONE]', 'chat stream: ends with [DONE]');
my @chunks = map { decode_json($_->[1]) } @ev[0 .. $#ev - 1];
is(scalar(grep { $_->{id} eq $chunks[0]{id} } @chunks), scalar @chunks,
   'chat stream: one id');
is(scalar(grep { $_->{object} eq 'chat.completion.chunk' } @chunks),
   scalar @chunks, 'chat stream: chunk objects');
is($chunks[0]{choices}[0]{delta}{role}, 'assistant',
   'chat stream: first delta has the role');
my ($reason, $content, @tool) = ('', '');
for my $c (@chunks) {
    my $d = $c->{choices}[0] && $c->{choices}[0]{delta} or next;
    $reason .= $d->{reasoning_content} // '';
    $content .= $d->{content} // '';
    push @tool, @{ $d->{tool_calls} } if $d->{tool_calls};
}
is($reason, 'Think.', 'chat stream: reasoning deltas');
is($content, 'Hello!', 'chat stream: content deltas');
is_deeply($tool[0], { index => 0, id => 'call_7', type => 'function',
          function => { name => 'get_weather', arguments => '' } },
          'chat stream: first tool delta has id, type and name');
is(join('', map { $_->{function}{arguments} } @tool), '{"city":"Paris"}',
   'chat stream: argument deltas');
ok(!grep({ exists $_->{id} } @tool[1 .. $#tool]),
   'chat stream: later tool deltas carry only arguments');
my @fin = grep { $_->{choices}[0] && $_->{choices}[0]{finish_reason} } @chunks;
is(scalar @fin, 1, 'chat stream: one finish_reason');
is($fin[0]{choices}[0]{finish_reason}, 'tool_calls', 'chat stream: reason');
is($chunks[-2]{choices}[0]{finish_reason}, 'tool_calls',
   'chat stream: finish is the last choice chunk');
is_deeply($chunks[-1]{choices}, [], 'chat stream: usage chunk has no choices');
is($chunks[-1]{usage}{completion_tokens}, 28, 'chat stream: usage chunk');
ok(exists $chunks[1]{usage} && !defined $chunks[1]{usage},
   'chat stream: usage null in other chunks');

$r = stream('/v1/chat/completions', { model => 'demo', messages => $user,
            stream => $true, test_script => { content => 'ok' } });
@chunks = map { decode_json($_->[1]) } @{ $r->{events} }[0 .. $#{ $r->{events} } - 1];
ok(!grep({ exists $_->{usage} } @chunks), 'no usage without include_usage');

# tokens are flushed as produced: 4 tokens, 250 ms apart
$r = stream('/v1/chat/completions', { model => 'demo', messages => $user,
            stream => $true, test_script => { content => 'abcd', step_ms => 250 } });
my @tok = grep { $_->[1] =~ /"content":"[a-d]"/ } @{ $r->{chunks} };
is(scalar @tok, 4, 'each token arrives in its own chunk');
cmp_ok($tok[-1][0] - $tok[0][0], '>', 0.5,
       'tokens arrive as generated, not buffered to the end')
    if @tok == 4;

# ---- log probabilities ----------------------------------------------------------
my $lp = { content => "a\x{e9}", logprobs => $true };
my @want = (
    { token => 'a', logprob => -0.25, bytes => [97],
      top_logprobs => [{ token => 'a', logprob => -0.25, bytes => [97] },
                       { token => '?', logprob => -2.5, bytes => [63] }] },
    { token => "\x{e9}", logprob => -0.25, bytes => [195, 169],
      top_logprobs => [{ token => "\x{e9}", logprob => -0.25, bytes => [195, 169] },
                       { token => '?', logprob => -2.5, bytes => [63] }] });
$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
          logprobs => $true, top_logprobs => 2, test_script => $lp });
is_deeply($r->{json}{choices}[0]{logprobs}, { content => \@want, refusal => undef },
          'chat: logprobs per token with top_logprobs and bytes');
$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
                                    test_script => $lp });
ok(exists $r->{json}{choices}[0]{logprobs}
   && !defined $r->{json}{choices}[0]{logprobs}, 'chat: logprobs null unless asked');
$r = stream('/v1/chat/completions', { model => 'demo', messages => $user,
            stream => $true, logprobs => $true, top_logprobs => 2,
            test_script => $lp });
@chunks = map { decode_json($_->[1]) } @{ $r->{events} }[0 .. $#{ $r->{events} } - 1];
is_deeply([map { @{ $_->{choices}[0]{logprobs}{content} } }
           grep { $_->{choices}[0] && $_->{choices}[0]{logprobs} } @chunks],
          \@want, 'chat stream: logprobs chunks');
$r = post('/v1/completions', { model => 'demo', prompt => 'p', logprobs => 2,
                               test_script => $lp });
is_deeply($r->{json}{choices}[0]{logprobs}, {
    tokens => ['a', "\x{e9}"], token_logprobs => [-0.25, -0.25],
    top_logprobs => [{ a => -0.25, '?' => -2.5 }, { "\x{e9}" => -0.25, '?' => -2.5 }],
    text_offset => [0, 1] }, 'completions: legacy logprobs');

# ---- completions -------------------------------------------------------------
$r = post('/v1/completions', { model => 'demo', prompt => 'Once',
                               test_script => { content => ' upon' } });
is($r->{status}, 200, 'completions: 200');
like($r->{json}{id}, qr/^cmpl-[0-9a-f]{32}$/, 'completions: id');
is($r->{json}{object}, 'text_completion', 'completions: object');
is($r->{json}{choices}[0]{text}, ' upon', 'completions: text');
is($r->{json}{choices}[0]{finish_reason}, 'stop', 'completions: finish');
is($r->{json}{usage}{prompt_tokens}, 4, 'completions: prompt tokens');

$r = post('/v1/completions', { model => 'demo', prompt => 'Once',
                               test_script => { content => 'x' x 40 } });
is(length $r->{json}{choices}[0]{text}, 16,
   'completions: max_tokens defaults to 16');

$r = stream('/v1/completions', { model => 'demo', prompt => 'Once',
            stream => $true, stream_options => { include_usage => $true },
            test_script => { content => 'ab' } });
@ev = @{ $r->{events} };
is($ev[-1][1], '[DONE]', 'completions stream: [DONE]');
@chunks = map { decode_json($_->[1]) } @ev[0 .. $#ev - 1];
is(join('', map { $_->{choices}[0] ? $_->{choices}[0]{text} : '' } @chunks),
   'ab', 'completions stream: text');
is($chunks[-2]{choices}[0]{finish_reason}, 'stop',
   'completions stream: finish');
is($chunks[-1]{usage}{completion_tokens}, 2, 'completions stream: usage');
is($chunks[0]{object}, 'text_completion', 'completions stream: object');

# ---- responses ----------------------------------------------------------------
$r = post('/v1/responses', { model => 'demo', input => 'hi',
                             instructions => 'ab', test_script => \%script });
is($r->{status}, 200, 'responses: 200') or diag($r->{content});
$j = $r->{json};
like($j->{id}, qr/^resp_[0-9a-f]{32}$/, 'responses: id');
is($j->{object}, 'response', 'responses: object');
is($j->{status}, 'completed', 'responses: status');
is_deeply([map { $_->{type} } @{ $j->{output} }],
          [qw(reasoning message function_call)], 'responses: output items');
is($j->{output}[0]{content}[0]{type}, 'reasoning_text', 'reasoning item');
is($j->{output}[0]{content}[0]{text}, 'Think.', 'reasoning text');
is($j->{output}[1]{content}[0]{type}, 'output_text', 'message item');
is($j->{output}[1]{content}[0]{text}, 'Hello!', 'message text');
is($j->{output}[2]{call_id}, 'call_7', 'function_call call_id');
is($j->{output}[2]{name}, 'get_weather', 'function_call name');
is($j->{output}[2]{arguments}, '{"city":"Paris"}', 'function_call arguments');
is($j->{usage}{input_tokens}, 4, 'responses: instructions + input reach the engine');
is($j->{usage}{output_tokens}, 28, 'responses: output_tokens');
is($j->{usage}{output_tokens_details}{reasoning_tokens}, 6,
   'responses: reasoning tokens');
is($j->{usage}{total_tokens}, 32, 'responses: total_tokens');
is($j->{instructions}, 'ab', 'responses: echoes instructions');
is($j->{store}, JSON::PP::false, 'responses: store false');

$r = post('/v1/responses', { model => 'demo', test_script => {},
          input => [{ role => 'user', content => [{ type => 'input_text', text => 'q' }] },
                    { type => 'function_call', call_id => 'c1', name => 'f',
                      arguments => '{}' },
                    { type => 'function_call_output', call_id => 'c1',
                      output => 'xyz' }] });
is($r->{json}{usage}{input_tokens}, 4,
   'responses: function_call_output becomes a tool message');

$r = post('/v1/responses', { model => 'demo', input => 'hi',
          max_output_tokens => 2, test_script => { content => 'abcdef' } });
is($r->{json}{status}, 'incomplete', 'responses: length -> incomplete');
is($r->{json}{incomplete_details}{reason}, 'max_output_tokens',
   'responses: incomplete_details');
is($r->{json}{output}[-1]{status}, 'incomplete',
   'responses: the truncated message item is incomplete too');
$r = stream('/v1/responses', { model => 'demo', input => 'hi', stream => $true,
            max_output_tokens => 2, test_script => { content => 'abcdef' } });
my ($item_done) = grep { $_->[0] eq 'response.output_item.done' } @{ $r->{events} };
is($item_done && decode_json($item_done->[1])->{item}{status}, 'incomplete',
   'responses stream: output_item.done of the truncated message: incomplete');

$r = stream('/v1/responses', { model => 'demo', input => 'hi',
            stream => $true, test_script => \%script });
is($r->{status}, 200, 'responses stream: 200');
@ev = @{ $r->{events} };
my @data = map { decode_json($_->[1]) } @ev;
is(scalar(grep { $ev[$_][0] eq $data[$_]{type} } 0 .. $#ev), scalar @ev,
   'responses stream: event: line matches type');
is_deeply([map { $_->{sequence_number} } @data], [0 .. $#data],
          'responses stream: sequence_number increases from 0');
my @types;
for my $d (@data) {   # collapse runs of deltas
    push @types, $d->{type} unless @types && $types[-1] eq $d->{type}
                                && $d->{type} =~ /delta$/;
}
is_deeply(\@types, [qw(
    response.created response.in_progress
    response.output_item.added response.content_part.added
    response.reasoning_text.delta response.reasoning_text.done
    response.content_part.done response.output_item.done
    response.output_item.added response.content_part.added
    response.output_text.delta response.output_text.done
    response.content_part.done response.output_item.done
    response.output_item.added
    response.function_call_arguments.delta
    response.function_call_arguments.done response.output_item.done
    response.completed)], 'responses stream: event sequence');
is(join('', map { $_->{delta} } grep { $_->{type} eq 'response.output_text.delta' } @data),
   'Hello!', 'responses stream: text deltas');
my ($done) = grep { $_->{type} eq 'response.function_call_arguments.done' } @data;
is($done->{arguments}, '{"city":"Paris"}', 'responses stream: arguments done');
is($data[-1]{response}{status}, 'completed', 'responses stream: completed');
is(scalar @{ $data[-1]{response}{output} }, 3,
   'responses stream: final response has every item');

# ---- tokenize / detokenize ------------------------------------------------------
$r = post('/tokenize', { model => 'demo', prompt => "h\x{e9}llo" });
is($r->{status}, 200, 'tokenize: 200');
is_deeply($r->{json}, { count => 5, max_model_len => 4096,
                        tokens => [104, 233, 108, 108, 111] },
          'tokenize: tokens, count, max_model_len');
$r = post('/tokenize', { model => 'demo', messages => $user });
is($r->{json}{count}, 2, 'tokenize: messages');
$r = post('/detokenize', { model => 'demo', tokens => [104, 105] });
is_deeply($r->{json}, { prompt => 'hi' }, 'detokenize');

# ---- engine errors before the headers -------------------------------------------
$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
          test_script => { prompt_tokens => 5000 } });
is($r->{status}, 400, 'context too long: 400');
is($r->{json}{error}{code}, 'context_length_exceeded', 'context: code');
like($r->{json}{error}{message}, qr/maximum context length is 4096 tokens/,
     'context: the message states the limit');
is($r->{json}{error}{type}, 'invalid_request_error', 'context: type');

$r = post('/v1/chat/completions', { model => 'demo', messages => $user,
          stream => $true,
          test_script => { error => { status => 503, code => 'busy',
                                      message => 'try later' } } });
is($r->{status}, 503, 'engine 503 before headers: HTTP 503 even when streaming');
is($r->{json}{error}{code}, 'busy', 'engine error code passed on');
ok($r->{headers}{'retry-after'}, '503 carries Retry-After');

$r = post('/v1/chat/completions', { model => 'demo', messages => $user, n => 2 });
is($r->{status}, 400, 'the scripted runner refuses n > 1 (t/82 has the model runner)');
is($r->{json}{error}{param}, 'n', 'and names n');

$r = http('GET', "$base/health");
is($r->{status}, 200, 'engine errors did not make the engine unhealthy');

stop_nginx($dir);
stop_engine($epid);
done_testing();
