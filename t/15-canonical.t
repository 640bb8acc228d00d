# The canonical engine request: what nginx hands the engine, read back from
# nginx's debug log.  Checks the normalizations docs/NGINX.md promises:
# max_completion_tokens over max_tokens, stop as an array, thinking and
# reasoning_effort resolved, unknown and nginx-only fields dropped, the
# Responses API converted to chat messages, completions' default max_tokens.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http free_port
               api_server);
use JSON::PP;

my $dir = scratch_dir();
my $port = free_port();
my $server = api_server($port, [qw(chat_completions completions responses
                                   tokenize detokenize)]);
write_conf($dir, <<"CONF", log_level => 'debug');
    llm_engine e1 run_dir=$dir;
    llm_route demo e1;
$server
CONF
start_nginx($dir, $port);

my $n = 0;
sub canonical {
    my ($path, $body) = @_;
    my $id = 'canon-' . $n++;
    my $r = http('POST', "http://127.0.0.1:$port$path", encode_json($body),
                 { 'X-Request-Id' => $id });
    is($r->{status}, 503, "$id reaches admission") or diag($r->{content});
    open my $f, '<', "$dir/logs/error.log" or die $!;
    my ($line) = grep { /llm request \Q$id\E: / } <$f>;
    my ($json) = ($line // '') =~ /llm request \Q$id\E: (\{.*\})/;
    my $c = eval { decode_json($json) } or return undef;
    like(delete $c->{id}, qr/^[0-9a-f]{32}$/, "$id: id is ours");
    return $c;
}

my ($t, $f) = (JSON::PP::true, JSON::PP::false);

is_deeply(canonical('/v1/chat/completions', {
    model => 'demo', foo => 1, user => 'u', n => 1, stream => $t,
    stream_options => { include_usage => $t },
    messages => [{ role => 'user', content => 'hi', extra => 1 }],
    max_tokens => 5, max_completion_tokens => 7, stop => 'x',
    temperature => 0.5, top_k => 5.0, seed => -3,
    chat_template_kwargs => { enable_thinking => $t, other => 1 },
    reasoning_effort => 'high', test_script => { content => 'no' } }),
  { kind => 'chat', model => 'demo',
    messages => [{ role => 'user', content => 'hi' }],
    chat_template_kwargs => { thinking => $t }, reasoning_effort => 'high',
    temperature => 0.5, top_k => 5, seed => -3, stop => ['x'],
    max_tokens => 7 },
  'chat: resolved and normalized; test_script not forwarded by default');

is_deeply(canonical('/v1/chat/completions', {
    model => 'demo', messages => [
        { role => 'system', content => 's' },
        { role => 'user', content => [{ type => 'text', text => 'a' }] },
        { role => 'assistant', content => undef, reasoning_content => 'r',
          tool_calls => [{ id => 'c1', function => { name => 'f',
                                                     arguments => '{}' } }] },
        { role => 'tool', tool_call_id => 'c1', content => 'o', name => 'f' }],
    tools => [{ type => 'function', function => { name => 'f',
                description => 'd', parameters => { type => 'object' } } }],
    tool_choice => 'auto', parallel_tool_calls => $f,
    response_format => { type => 'json_object' },
    reasoning_effort => 'low',
    chat_template_kwargs => { reasoning_effort => 'max', drop_thinking => $f } }),
  { kind => 'chat', model => 'demo', messages => [
        { role => 'system', content => 's' },
        { role => 'user', content => [{ type => 'text', text => 'a' }] },
        { role => 'assistant', content => undef, reasoning_content => 'r',
          tool_calls => [{ id => 'c1', type => 'function',
                           function => { name => 'f', arguments => '{}' } }] },
        { role => 'tool', content => 'o', name => 'f', tool_call_id => 'c1' }],
    tools => [{ type => 'function', function => { name => 'f',
                description => 'd', parameters => { type => 'object' } } }],
    tool_choice => 'auto', parallel_tool_calls => $f,
    response_format => { type => 'json_object' },
    chat_template_kwargs => { drop_thinking => $f },
    reasoning_effort => 'max' },
  'chat: messages, tools, kwargs effort over the top-level one');

is_deeply(canonical('/v1/responses', {
    model => 'demo', instructions => 'sys', store => $f,
    input => [
        { role => 'user', content => [{ type => 'input_text', text => 'q' }] },
        { type => 'reasoning', content => [{ type => 'reasoning_text', text => 'r' }] },
        { type => 'function_call', call_id => 'c1', name => 'f', arguments => '{}' },
        { type => 'function_call', call_id => 'c2', name => 'g',
          arguments => '{"a":1}' },
        { type => 'function_call_output', call_id => 'c1', output => 'o1' },
        { type => 'message', role => 'assistant',
          content => [{ type => 'output_text', text => 'done' }] },
        { type => 'function_call', call_id => 'c3', name => 'f', arguments => '{}' }],
    tools => [{ type => 'function', name => 'f', parameters => { type => 'object' } }],
    tool_choice => { type => 'function', name => 'f' },
    reasoning => { effort => 'low' }, max_output_tokens => 9,
    text => { format => { type => 'json_schema', name => 's',
                          schema => { type => 'object' } } } }),
  { kind => 'chat', model => 'demo', messages => [
        { role => 'system', content => 'sys' },
        { role => 'user', content => [{ type => 'text', text => 'q' }] },
        { role => 'assistant', content => undef, reasoning_content => 'r',
          tool_calls => [
            { id => 'c1', type => 'function', function => { name => 'f', arguments => '{}' } },
            { id => 'c2', type => 'function', function => { name => 'g', arguments => '{"a":1}' } }] },
        { role => 'tool', content => 'o1', tool_call_id => 'c1' },
        { role => 'assistant', content => [{ type => 'text', text => 'done' }],
          tool_calls => [
            { id => 'c3', type => 'function', function => { name => 'f', arguments => '{}' } }] }],
    tools => [{ type => 'function', function => { name => 'f',
                parameters => { type => 'object' } } }],
    tool_choice => { type => 'function', function => { name => 'f' } },
    max_tokens => 9,
    response_format => { type => 'json_schema',
                         json_schema => { name => 's', schema => { type => 'object' } } },
    chat_template_kwargs => { thinking => $t }, reasoning_effort => 'low' },
  'responses: converted to chat messages');

is_deeply(canonical('/v1/responses', { model => 'demo', input => 'hello',
                                       reasoning => { effort => 'none' } }),
  { kind => 'chat', model => 'demo',
    messages => [{ role => 'user', content => 'hello' }],
    chat_template_kwargs => { thinking => $f }, reasoning_effort => 'none' },
  'responses: string input; effort none turns thinking off');

is_deeply(canonical('/v1/completions', { model => 'demo', prompt => [[1, 2]],
    seed => 1.0, stop => ['a', 'b'], min_tokens => 2, ignore_eos => $t,
    skip_special_tokens => $f }),
  { kind => 'completion', model => 'demo', prompt => [1, 2], max_tokens => 16,
    seed => 1, stop => ['a', 'b'], min_tokens => 2, ignore_eos => $t,
    skip_special_tokens => $f },
  'completions: one batched prompt unwrapped, max_tokens 16 by default');

is_deeply(canonical('/v1/chat/completions', { model => 'demo',
    messages => [{ role => 'user', content => 'm' }], logprobs => $t,
    top_logprobs => 2 }),
  { kind => 'chat', model => 'demo',
    messages => [{ role => 'user', content => 'm' }],
    logprobs => $t, top_logprobs => 2 }, 'chat: logprobs');

is_deeply(canonical('/v1/completions', { model => 'demo', prompt => 'p',
                                         logprobs => 0 }),
  { kind => 'completion', model => 'demo', prompt => 'p', max_tokens => 16,
    logprobs => $t, top_logprobs => 0 }, 'completions: logprobs');

is_deeply(canonical('/tokenize', { model => 'demo', prompt => 'p',
                                   add_special_tokens => $f }),
  { kind => 'tokenize', model => 'demo', prompt => 'p',
    add_special_tokens => $f }, 'tokenize: prompt');

is_deeply(canonical('/tokenize', { model => 'demo',
    messages => [{ role => 'user', content => 'm' }],
    add_generation_prompt => $f, chat_template_kwargs => { thinking => $t } }),
  { kind => 'tokenize', model => 'demo',
    messages => [{ role => 'user', content => 'm' }],
    chat_template_kwargs => { thinking => $t }, add_generation_prompt => $f },
  'tokenize: messages with chat fields');

is_deeply(canonical('/detokenize', { model => 'demo', tokens => [3, 4.0] }),
  { kind => 'detokenize', model => 'demo', tokens => [3, 4] }, 'detokenize');

# (\u0000 is refused as not text: t/10-validation.t)
my $text = canonical('/v1/chat/completions', { model => 'demo',
    messages => [{ role => 'user', content => "a\x{e9}b\x{1F600}\\\"" }] });
is($text->{messages}[0]{content}, "a\x{e9}b\x{1F600}\\\"",
   'string bytes kept exactly (non-ASCII, escapes)');

stop_nginx($dir);
done_testing();
