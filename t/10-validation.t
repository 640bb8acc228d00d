# Request validation: every endpoint's client errors have the OpenAI error
# shape, the right status and name the offending field; valid requests get
# past validation (to 503 here: the configured engine is not running).
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx http free_port
               api_server repo_root);
use IO::Socket::INET;
use JSON::PP;

my $dir = scratch_dir();
my $port = free_port();
my $server = api_server($port, [qw(chat_completions completions responses
                                   tokenize detokenize health)], more => <<"MORE");
        location = /big {
            llm_api chat_completions;
            llm_max_body_size 3m;
        }
        location / { llm_api not_found; }
        include ${\ repo_root()}/conf/llm_error_pages.conf;
MORE
write_conf($dir, <<"CONF");
    llm_engine e1 run_dir=$dir;
    llm_route demo e1;
    llm_max_body_size 4k;
$server
CONF
start_nginx($dir, $port);

my $base = "http://127.0.0.1:$port";

sub post {
    my ($path, $body, $headers) = @_;
    $body = encode_json($body) if ref $body;
    my $r = http('POST', "$base$path", $body, $headers);
    $r->{json} = eval { decode_json($r->{content}) };
    return $r;
}

# expect_error($path, $body, $status, $param, $message_re, $name)
sub expect_error {
    my ($path, $body, $status, $param, $re, $name) = @_;
    my $r = post($path, $body);
    subtest $name => sub {
        is($r->{status}, $status, "status $status") or diag($r->{content});
        my $e = $r->{json} && $r->{json}{error};
        ok($e, 'OpenAI error object') or return;
        is_deeply([sort keys %$e], [qw(code message param type)],
                  'error has message, type, param, code');
        is($e->{param}, $param, 'param names the field');
        like($e->{message}, $re, 'message says what is wrong');
        is($e->{type}, 'invalid_request_error', 'type')
            if $status == 400 || $status == 404;
        like($r->{headers}{'x-request-id'} // '', qr/^[0-9a-f]{32}$/,
             'X-Request-Id generated');
    };
    return $r;
}

my $msgs = [{ role => 'user', content => 'hi' }];
my %chat = (model => 'demo', messages => $msgs);

# ---- body and JSON -------------------------------------------------------
expect_error('/v1/chat/completions', '{"model": "demo", "messages": [',
             400, undef, qr/^malformed JSON at byte \d+/, 'truncated JSON');
expect_error('/v1/chat/completions', '[1, 2]', 400, undef,
             qr/must be a JSON object/, 'body is not an object');
expect_error('/v1/chat/completions', '', 400, undef, qr/empty/, 'empty body');
expect_error('/v1/chat/completions', "{\"model\": \"d\xffx\"}", 400, undef,
             qr/malformed JSON/, 'invalid UTF-8');
expect_error('/v1/chat/completions', ('[' x 200) . (']' x 200), 400, undef,
             qr/nested deeper than 128/, 'deep nesting');
expect_error('/v1/chat/completions', '{"model": "demo"} x', 400, undef,
             qr/malformed JSON/, 'trailing garbage');

my $big = post('/v1/chat/completions',
               { %chat, messages => [{ role => 'user', content => 'x' x 5000 }] });
is($big->{status}, 413, 'body over llm_max_body_size: 413');
is($big->{json}{error}{code}, 'request_too_large', '413 code');

my $chunks = 0;
my $chunked = HTTP::Tiny->new(timeout => 10)->request('POST',
    "$base/v1/chat/completions", {
        headers => { 'Content-Type' => 'application/json' },
        content => sub { $chunks++ < 10 ? ('x' x 1000) : undef } });
is($chunked->{status}, 413, 'chunked body over the limit: 413');
like($chunked->{content}, qr/"code":"request_too_large"/,
     'an OpenAI error, not nginx\'s page');

# above nginx's default client_max_body_size (1m), within llm_max_body_size
my $large = post('/big', { %chat, messages => [{ role => 'user',
                                                 content => 'y' x 2_000_000 }] });
is($large->{status}, 503, 'a 2 MB request within llm_max_body_size passes');
# the same, chunked: nginx does not know its size in advance
my $json = encode_json({ %chat, messages => [{ role => 'user',
                                               content => 'z' x 2_000_000 }] });
my $sent = 0;
my $large_chunked = HTTP::Tiny->new(timeout => 10)->request('POST', "$base/big", {
    headers => { 'Content-Type' => 'application/json' },
    content => sub { return undef if $sent >= length $json;
                     my $c = substr($json, $sent, 65536); $sent += length $c;
                     return $c } });
is($large_chunked->{status}, 503, 'a 2 MB chunked request passes too')
    or diag($large_chunked->{content});
# bodies stay in memory up to llm_max_body_size: a worker never reads a
# temporary file back on its event loop
my $log = do { local (@ARGV, $/) = "$dir/logs/error.log"; <> };
unlike($log, qr/buffered to a temporary file/,
       'no request body went to a temporary file');

# ---- errors nginx raises before the module runs ------------------------------
# conf/llm_error_pages.conf turns them into OpenAI error bodies too
sub raw {
    my ($req) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 10)
        or die "connect: $!";
    print $s $req;
    local $/;
    my $res = <$s> // '';
    my ($head, $body) = split /\r\n\r\n/, $res, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};
    return { status => $status // 0, head => $head // '', body => $body // '',
             json => scalar eval { decode_json($body // '') } };
}
my $post = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n";
my @nginx_errors = (
    ['a bad chunk size', $post . "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
     400, qr/malformed HTTP/],
    ['Content-Length with Transfer-Encoding', $post . "Content-Length: 5\r\n"
     . "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, qr/malformed HTTP/],
    ['a URI over the header buffers', 'GET /v1/' . ('u' x 20000)
     . " HTTP/1.1\r\nHost: x\r\n\r\n", 414, qr/URI is too long/],
    ['a header flood', $post . join('', map { "X-H$_: " . ('h' x 1000) . "\r\n" }
     1 .. 40) . "\r\n", 400, qr/headers? .*too large/],
    ['an unknown Transfer-Encoding', $post . "Transfer-Encoding: gzip\r\n\r\n",
     501, qr/Transfer-Encoding/],
);
for my $c (@nginx_errors) {
    my ($name, $req, $status, $re) = @$c;
    my $r = raw($req);
    subtest "nginx's own error: $name" => sub {
        is($r->{status}, $status, "status $status") or diag($r->{head});
        like($r->{head}, qr{\r\nContent-Type: application/json}i, 'JSON');
        my $e = $r->{json} && $r->{json}{error};
        ok($e, 'OpenAI error object') or return diag($r->{body});
        is_deeply([sort keys %$e], [qw(code message param type)],
                  'error has message, type, param, code');
        like($e->{message}, $re, 'message says what is wrong');
        is($e->{type}, $status < 500 ? 'invalid_request_error' : 'server_error',
           'type');
    };
}

my $direct = http('GET', "$base/_llm_error");
is($direct->{status}, 404, 'the error page location asked directly: 404');
like($direct->{content}, qr/"code":"not_found"/, 'as an OpenAI error');

# ---- methods and paths ----------------------------------------------------
my $g = http('GET', "$base/v1/chat/completions");
is($g->{status}, 405, 'GET on chat: 405');
is($g->{headers}{allow}, 'POST', 'Allow: POST');
my $nf = http('GET', "$base/v1/nothing");
is($nf->{status}, 404, 'unknown path: 404');
is(eval { decode_json($nf->{content})->{error}{code} }, 'model_not_found',
   'unknown path code');

# ---- model ----------------------------------------------------------------
expect_error('/v1/chat/completions', { messages => $msgs }, 400, 'model',
             qr/^model is required/, 'model missing');
expect_error('/v1/chat/completions', { model => 3, messages => $msgs }, 400,
             'model', qr/must be a string/, 'model wrong type');
my $unk = expect_error('/v1/chat/completions', { %chat, model => 'gpt-9' },
                       404, 'model', qr/"gpt-9" does not exist/,
                       'unknown model');
is($unk->{json}{error}{code}, 'model_not_found', 'unknown model code');

# ---- chat fields ------------------------------------------------------------
my @chat_bad = (
    [{ model => 'demo' }, 'messages', qr/required/],
    [{ %chat, messages => [] }, 'messages', qr/non-empty/],
    [{ %chat, messages => ['hi'] }, 'messages[0]', qr/must be an object/],
    [{ %chat, messages => [{ role => 'robot', content => 'x' }] },
     'messages[0].role', qr/must be one of/],
    [{ %chat, messages => [{ role => 'user' }] }, 'messages[0].content',
     qr/is required/],
    [{ %chat, messages => [{ role => 'user', content => 5 }] },
     'messages[0].content', qr/string or an array of text parts/],
    [{ %chat, messages => [{ role => 'user', content =>
        [{ type => 'image_url', image_url => { url => 'x' } }] }] },
     'messages[0].content[0]', qr/only text content/],
    [{ %chat, messages => [{ role => 'user', content => [{ type => 'text' }] }] },
     'messages[0].content[0].text', qr/is required/],
    [{ %chat, messages => [{ role => 'tool', content => 'r' }] },
     'messages[0].tool_call_id', qr/is required/],
    [{ %chat, messages => [{ role => 'assistant' }] },
     'messages[0].content', qr/unless the message has tool_calls/],
    [{ %chat, messages => [@$msgs, { role => 'assistant', tool_calls =>
        [{ id => 'c1', type => 'function',
           function => { name => 'f', arguments => '{"a":' } }] }] },
     'messages[1].tool_calls[0].function.arguments',
     qr/JSON object encoded as a string/],
    [{ %chat, messages => [@$msgs, { role => 'assistant', tool_calls =>
        [{ id => 'c1', function => { name => 'f"><x', arguments => '{}' } }] }] },
     'messages[1].tool_calls[0].function.name', qr/only letters, digits/],
    [{ %chat, temperature => 'hot' }, 'temperature', qr/must be a number/],
    [{ %chat, temperature => 2.5 }, 'temperature', qr/at most 2/],
    [{ %chat, top_p => 0 }, 'top_p', qr/greater than 0/],
    [{ %chat, top_k => 1.5 }, 'top_k', qr/must be an integer/],
    [{ %chat, min_p => -0.1 }, 'min_p', qr/at least 0/],
    [{ %chat, presence_penalty => 3 }, 'presence_penalty', qr/at most 2/],
    [{ %chat, repetition_penalty => 0 }, 'repetition_penalty',
     qr/greater than 0/],
    [{ %chat, seed => 'x' }, 'seed', qr/integer/],
    [{ %chat, max_tokens => 0 }, 'max_tokens', qr/between 1 and/],
    [{ %chat, max_completion_tokens => 'many' }, 'max_completion_tokens',
     qr/integer/],
    [{ %chat, stop => 7 }, 'stop', qr/string or an array of strings/],
    [{ %chat, min_tokens => -1 }, 'min_tokens', qr/between 0 and/],
    [{ %chat, max_tokens => 4, min_tokens => 5 }, 'min_tokens',
     qr/must not exceed the maximum of 4/],
    [{ %chat, ignore_eos => 1 }, 'ignore_eos', qr/boolean/],
    [{ %chat, skip_special_tokens => 'no' }, 'skip_special_tokens', qr/boolean/],
    [{ %chat, stop => ['a', ''] }, 'stop[1]', qr/non-empty string/],
    [{ %chat, n => 17 }, 'n', qr/between 1 and 16/],
    [{ %chat, stop => [map { "s$_" } 1 .. 17] }, 'stop', qr/at most 16 strings/],
    [{ %chat, stream => 'yes' }, 'stream', qr/must be a boolean/],
    [{ %chat, stream_options => { include_usage => JSON::PP::true } },
     'stream_options', qr/only allowed when stream is true/],
    [{ %chat, stream => JSON::PP::true, stream_options => { include_usage => 1 } },
     'stream_options.include_usage', qr/boolean/],
    [{ %chat, tools => {} }, 'tools', qr/must be an array/],
    [{ %chat, tools => [{ type => 'web_search' }] }, 'tools[0].type',
     qr/only function tools/],
    [{ %chat, tools => [{ type => 'function', function => { name => 'a b' } }] },
     'tools[0].function.name', qr/only letters/],
    [{ %chat, tools => [{ type => 'function',
                          function => { name => 'f', parameters => [] } }] },
     'tools[0].function.parameters', qr/must be an object/],
    [{ %chat, tool_choice => 'required' }, 'tool_choice', qr/needs tools/],
    [{ %chat, tool_choice => 'sometimes' }, 'tool_choice', qr/must be "none"/],
    [{ %chat, tools => [{ type => 'function', function => { name => 'f' } }],
       tool_choice => { type => 'function', function => { name => 'g' } } },
     'tool_choice', qr/"g" which is not in tools/],
    [{ %chat, parallel_tool_calls => 'no' }, 'parallel_tool_calls',
     qr/boolean/],
    [{ %chat, response_format => { type => 'xml' } }, 'response_format.type',
     qr/must be "text"/],
    [{ %chat, response_format => { type => 'json_schema' } },
     'response_format.json_schema', qr/must be an object/],
    [{ %chat, response_format => { type => 'json_schema',
                                   json_schema => { schema => {} } } },
     'response_format.json_schema.name', qr/is required/],
    [{ %chat, reasoning_effort => 'extreme' }, 'reasoning_effort',
     qr/must be one of none, minimal/],
    [{ %chat, chat_template_kwargs => [] }, 'chat_template_kwargs',
     qr/must be an object/],
    [{ %chat, chat_template_kwargs => { thinking => 'on' } },
     'chat_template_kwargs.thinking', qr/boolean/],
    [{ %chat, chat_template_kwargs => { thinking => JSON::PP::true,
                                        enable_thinking => JSON::PP::false } },
     'chat_template_kwargs', qr/different values/],
    [{ %chat, chat_template_kwargs => { reasoning_effort => 'x' } },
     'chat_template_kwargs.reasoning_effort', qr/must be one of/],
    [{ %chat, logprobs => 'yes' }, 'logprobs', qr/boolean/],
    [{ %chat, top_logprobs => 3 }, 'top_logprobs', qr/needs logprobs/],
    [{ %chat, logprobs => JSON::PP::true, top_logprobs => 21 }, 'top_logprobs',
     qr/between 0 and 20/],
    # asked for and not provided: refused, never ignored
    [{ %chat, functions => [{ name => 'f', parameters => {} }] }, 'functions',
     qr/not supported: pass tools instead/],
    [{ %chat, function_call => 'auto' }, 'function_call',
     qr/not supported: pass tool_choice instead/],
    [{ %chat, audio => { voice => 'alloy', format => 'wav' } }, 'audio',
     qr/answers in text only/],
    [{ %chat, modalities => ['text', 'audio'] }, 'modalities',
     qr/may name only "text"/],
    [{ %chat, modalities => ['text', 3] }, 'modalities[1]', qr/must be a string/],
    [{ %chat, modalities => 'text' }, 'modalities', qr/must be an array/],
    [{ %chat, web_search_options => {} }, 'web_search_options',
     qr/does not search the web/],
);
for my $c (@chat_bad) {
    expect_error('/v1/chat/completions', $c->[0], 400, $c->[1], $c->[2],
                 "chat: bad $c->[1]");
}

# ---- completions ------------------------------------------------------------
my %cmpl = (model => 'demo', prompt => 'Once');
my @cmpl_bad = (
    [{ model => 'demo' }, 'prompt', qr/is required/],
    [{ %cmpl, prompt => '' }, 'prompt', qr/must not be empty/],
    [{ %cmpl, prompt => ['a', 'b'] }, 'prompt', qr/several prompts/],
    [{ %cmpl, prompt => [1, -2] }, 'prompt[1]', qr/token id/],
    [{ %cmpl, prompt => {} }, 'prompt', qr/string or an array of token ids/],
    [{ %cmpl, echo => JSON::PP::true }, 'echo', qr/not supported/],
    [{ %cmpl, suffix => 'end' }, 'suffix', qr/not supported/],
    [{ %cmpl, best_of => 3 }, 'best_of', qr/must be 1/],
    [{ %cmpl, logprobs => 9 }, 'logprobs', qr/between 0 and 5/],
    [{ %cmpl, max_tokens => -1 }, 'max_tokens', qr/between 1/],
);
for my $c (@cmpl_bad) {
    expect_error('/v1/completions', $c->[0], 400, $c->[1], $c->[2],
                 "completions: bad $c->[1]");
}

# ---- responses --------------------------------------------------------------
my %resp = (model => 'demo', input => 'hi');
my @resp_bad = (
    [{ model => 'demo' }, 'input', qr/is required/],
    [{ %resp, input => 5 }, 'input', qr/string or an array of items/],
    [{ %resp, input => [] }, 'input', qr/at least one message/],
    [{ %resp, previous_response_id => 'resp_1' }, 'previous_response_id',
     qr/not supported: this server keeps no response store/],
    [{ %resp, store => JSON::PP::true }, 'store', qr/no response store/],
    [{ %resp, background => JSON::PP::true }, 'background',
     qr/no response store to poll/],
    [{ %resp, background => 'yes' }, 'background', qr/boolean/],
    [{ %resp, conversation => 'conv_1' }, 'conversation', qr/no conversations/],
    [{ %resp, prompt => { id => 'pmpt_1' } }, 'prompt', qr/no prompt templates/],
    [{ %resp, top_logprobs => 2 }, 'top_logprobs', qr/no log probabilities/],
    [{ %resp, top_logprobs => 21 }, 'top_logprobs', qr/between 0 and 20/],
    [{ %resp, include => ['reasoning.encrypted_content',
                          'message.output_text.logprobs'] }, 'include',
     qr/no log probabilities/],
    [{ %resp, include => [7] }, 'include[0]', qr/must be a string/],
    [{ %resp, input => [{ type => 'web_search_call' }] }, 'input[0].type',
     qr/must be message, function_call/],
    [{ %resp, input => [{ role => 'user', content =>
        [{ type => 'input_image', image_url => 'x' }] }] },
     'input[0].content[0]', qr/only text content/],
    [{ %resp, input => [{ type => 'function_call', call_id => 'c',
                          name => 'f', arguments => 'nope' }] },
     'input[0].arguments', qr/JSON object/],
    [{ %resp, input => [{ type => 'function_call_output', call_id => 'c' }] },
     'input[0].output', qr/is required/],
    [{ %resp, instructions => [] }, 'instructions', qr/must be a string/],
    [{ %resp, tools => [{ type => 'function' }] }, 'tools[0].name',
     qr/is required/],
    [{ %resp, tools => [{ type => 'file_search' }] }, 'tools[0].type',
     qr/only function tools/],
    [{ %resp, tools => [{ type => 'function', name => 'f' }],
       tool_choice => { type => 'function', name => 'h' } },
     'tool_choice', qr/"h" which is not in tools/],
    [{ %resp, reasoning => { effort => 'huge' } }, 'reasoning.effort',
     qr/must be one of/],
    [{ %resp, max_output_tokens => 0 }, 'max_output_tokens', qr/between 1/],
    [{ %resp, text => { format => { type => 'json_schema' } } },
     'text.format.name', qr/is required/],
);
for my $c (@resp_bad) {
    expect_error('/v1/responses', $c->[0], 400, $c->[1], $c->[2],
                 "responses: bad $c->[1]");
}

# ---- numbers out of range, text that is not valid Unicode ----------------------
my $pre = '{"model":"demo","messages":[{"role":"user","content":"hi"}]';
my @raw_bad = (
    ["$pre,\"temperature\":1e999}", 'temperature', qr/^temperature must be at least 0\.0 and at most 2\.0, got 1e999$/],
    ["$pre,\"top_p\":-1e999}", 'top_p', qr/at most 1\.0, got -1e999$/],
    ["$pre,\"max_tokens\":99999999999999999999}", 'max_tokens',
     qr/^max_tokens must be between 1 and \d+, got 99999999999999999999$/],
    ["$pre,\"top_k\":1e30}", 'top_k', qr/^top_k must be between -1 and \d+, got 1e30$/],
    ["$pre,\"seed\":-1e400}", 'seed', qr/^seed must be between -\d+ and \d+, got -1e400$/],
    ["$pre,\"top_k\":2.5}", 'top_k', qr/must be an integer, not a number with a fraction/],
);
for my $c (@raw_bad) {
    my $r = expect_error('/v1/chat/completions', $c->[0], 400, $c->[1], $c->[2],
                         "out of range: $c->[1]");
    unlike($r->{json}{error}{message} // '', qr/not a number|fraction/,
           "$c->[1]: not called a non-number or a fraction")
        unless $c->[0] =~ /2\.5/;
}
my @text_bad = (
    ['"a\\ud800b"', qr/contains an unpaired UTF-16 surrogate/, 'lone high surrogate'],
    ['"a\\udc00"', qr/contains an unpaired UTF-16 surrogate/, 'lone low surrogate'],
    ['"a\\ud800\\u0041"', qr/contains an unpaired UTF-16 surrogate/, 'high surrogate, no low'],
    ['"a\\u0000b"', qr/contains \\u0000/, 'an escaped NUL'],
    ["\"a\xc0\xafb\"", qr/is not valid UTF-8/, 'overlong UTF-8'],
    ["\"a\xed\xa0\x80b\"", qr/is not valid UTF-8/, 'an encoded surrogate'],
    ["\"a\xf4\x90\x80\x80\"", qr/is not valid UTF-8/, 'above U+10FFFF'],
);
for my $c (@text_bad) {
    expect_error('/v1/chat/completions',
                 '{"model":"demo","messages":[{"role":"user","content":' . $c->[0] . '}]}',
                 400, 'messages[0].content', $c->[1], "text: $c->[2]");
}
expect_error('/v1/chat/completions',
             '{"model":"demo","messages":[{"role":"user","content":"ok"}],'
             . '"metadata":{"k\\ud800":1}}', 400, 'metadata',
             qr/^metadata has a key that contains an unpaired UTF-16 surrogate/,
             'text: a bad key names its object');
my $pair = post('/v1/chat/completions',
                '{"model":"demo","messages":[{"role":"user","content":"\\ud83d\\ude00 '
                . "\xf0\x9f\x98\x80" . '"}]}');
is($pair->{status}, 503, 'a surrogate pair and 4-byte UTF-8 pass validation')
    or diag($pair->{content});
my $fg = post('/v1/responses', { model => 'demo', input => 'hi',
                                background => JSON::PP::false, top_logprobs => 0,
                                include => ['reasoning.encrypted_content'] });
is($fg->{status}, 503, 'responses: background false, top_logprobs 0, include of '
   . 'reasoning.encrypted_content pass validation')
    or diag($fg->{content});
my $text_only = post('/v1/chat/completions', { %chat, modalities => ['text'] });
is($text_only->{status}, 503, 'modalities ["text"] passes validation')
    or diag($text_only->{content});

# ---- /health?model= ------------------------------------------------------------
my $h = http('GET', "$base/health?model=nope");
is($h->{status}, 404, '/health?model=unknown: 404');
my $he = eval { decode_json($h->{content})->{error} } // {};
is($he->{code}, 'model_not_found', '404 code');
is($he->{param}, 'model', '404 names model');
is(http('GET', "$base/health?model=demo")->{status}, 503,
   '/health?model=known without an engine: 503');

# ---- tokenize / detokenize ----------------------------------------------------
expect_error('/tokenize', { model => 'demo' }, 400, 'prompt',
             qr/prompt or messages is required/, 'tokenize: nothing to count');
expect_error('/tokenize', { model => 'demo', messages => [{ role => 'x' }] },
             400, 'messages[0].role', qr/must be one of/,
             'tokenize: bad messages');
expect_error('/detokenize', { model => 'demo' }, 400, 'tokens',
             qr/required/, 'detokenize: tokens missing');
expect_error('/detokenize', { model => 'demo', tokens => [1, 'a'] }, 400,
             'tokens[1]', qr/token id/, 'detokenize: bad id');

# ---- valid requests pass validation ---------------------------------------------
my @valid = (
    ['/v1/chat/completions', { %chat, foo => 'ignored', user => 'u',
        temperature => 0, top_p => 1, top_k => -1, seed => -5, stop => 'x',
        max_completion_tokens => 10, max_tokens => 3, n => 1,
        stream => JSON::PP::true, stream_options => { include_usage => JSON::PP::true },
        tools => [{ type => 'function', function => { name => 'get_w',
                    description => 'd', parameters => { type => 'object' } } }],
        tool_choice => { type => 'function', function => { name => 'get_w' } },
        response_format => { type => 'json_schema',
                             json_schema => { name => 's', schema => {} } },
        reasoning_effort => 'high',
        chat_template_kwargs => { thinking => JSON::PP::true,
                                  drop_thinking => JSON::PP::false, other => 1 },
        messages => [{ role => 'system', content => 's' },
                     { role => 'user', content => [{ type => 'text', text => 'a' }] },
                     { role => 'assistant', content => undef, tool_calls =>
                        [{ id => 'c1', type => 'function',
                           function => { name => 'get_w', arguments => '{"x":1}' } }] },
                     { role => 'tool', tool_call_id => 'c1', content => 'sunny' }] }],
    ['/v1/completions', { %cmpl, prompt => [[1, 2, 3]], max_tokens => 5 }],
    ['/v1/responses', { %resp, instructions => 'be brief', store => JSON::PP::false,
        reasoning => { effort => 'low' }, max_output_tokens => 20,
        tools => [{ type => 'function', name => 'f', parameters => {} }],
        input => [{ role => 'user', content => 'q' },
                  { type => 'reasoning', content => [{ type => 'reasoning_text', text => 'r' }] },
                  { type => 'function_call', call_id => 'c', name => 'f', arguments => '{}' },
                  { type => 'function_call_output', call_id => 'c', output => 'o' }] }],
    ['/tokenize', { model => 'demo', prompt => 'count me' }],
    ['/tokenize', { %chat, add_generation_prompt => JSON::PP::true }],
    ['/detokenize', { model => 'demo', tokens => [1, 2] }],
);
for my $v (@valid) {
    my $r = post($v->[0], $v->[1], { 'X-Request-Id' => 'abc-123' });
    is($r->{status}, 503, "valid request to $v->[0] passes validation")
        or diag($r->{content});
    is($r->{headers}{'x-request-id'}, 'abc-123', 'client X-Request-Id kept');
    ok($r->{headers}{'retry-after'}, '503 carries Retry-After');
}

stop_nginx($dir);
done_testing();
