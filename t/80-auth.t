# API keys (llm_api_key, llm_api_key_file, llm_api_key_required) and
# GET /v1/models/{id}, against a real engine (scripted test runner).
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx http http_json free_port
               engine_name start_engine wait_for api_server nginx_test);
use JSON::PP;

my $dir = scratch_dir();
my $port = free_port();
my $name = engine_name('auth');
start_engine($dir, $name, max_num_seqs => 4);

open my $kf, '>', "$dir/keys" or die $!;
print $kf "# one key a line\n\n  key-from-file  \r\nsecond-file-key\n";
close $kf;

# a second server without keys: everything open
my $port2 = free_port();
my $open = api_server($port2, [qw(chat_completions models)]);
my $server = api_server($port, [qw(chat_completions completions responses
                                   tokenize models health metrics messages
                                   count_tokens)], more => <<"MORE");
        location /v1/models/ { llm_api models; }
        location = /open/v1/models { llm_api models;
                                     llm_api_key_required off; }
        location = /keyed/health { llm_api health;
                                   llm_api_key_required on; }
        llm_api_key sk-test-1 sk-test-2;
        llm_api_key_file $dir/keys;
MORE
write_conf($dir, <<"CONF");
    llm_engine $name run_dir=$dir;
    llm_health interval=100ms passes=1;
    llm_test_script on;
$open
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 10),
   'engine becomes healthy; /health is open by default')
    or BAIL_OUT('engine never became healthy');

my $chat = encode_json({ model => 'demo', max_tokens => 4,
                         messages => [{ role => 'user', content => 'hi' }],
                         test_script => { content => 'ok' } });
my $msgs = encode_json({ model => 'demo', max_tokens => 4,
                         messages => [{ role => 'user', content => 'hi' }],
                         test_script => { content => 'ok' } });
sub bearer { { Authorization => "Bearer $_[0]" } }

# ---- OpenAI endpoints ----------------------------------------------------
my $r = http_json('POST', "$base/v1/chat/completions", $chat);
is($r->{status}, 401, 'no key: 401');
is($r->{headers}{'www-authenticate'}, 'Bearer', 'WWW-Authenticate: Bearer');
is($r->{json}{error}{type}, 'invalid_request_error', 'OpenAI error type');
is($r->{json}{error}{code}, undef, 'missing key: code null, as OpenAI');
like($r->{json}{error}{message}, qr/didn't provide an API key/,
     'missing key: OpenAI message');

$r = http_json('POST', "$base/v1/chat/completions", $chat, bearer('sk-test'));
is($r->{status}, 401, 'a prefix of a key: 401');
is($r->{json}{error}{code}, 'invalid_api_key', 'wrong key: invalid_api_key');

for my $bad ('sk-test-10', 'SK-TEST-1', '', 'sk-test-1x', 'x') {
    $r = http('POST', "$base/v1/chat/completions", $chat, bearer($bad));
    is($r->{status}, 401, "key '$bad': 401");
}
$r = http('POST', "$base/v1/chat/completions", $chat,
          { Authorization => 'Basic c2stdGVzdC0xOg==' });
is($r->{status}, 401, 'Basic auth: 401');
$r = http('POST', "$base/v1/chat/completions", $chat,
          { 'x-api-key' => 'sk-test-1' });
is($r->{status}, 401, 'x-api-key is not taken on OpenAI endpoints');

for my $key (qw(sk-test-1 sk-test-2 key-from-file second-file-key)) {
    $r = http_json('POST', "$base/v1/chat/completions", $chat, bearer($key));
    is($r->{status}, 200, "key $key: 200") or diag($r->{content});
}
$r = http_json('POST', "$base/v1/chat/completions", $chat,
               { Authorization => 'bearer sk-test-2' });
is($r->{status}, 200, 'the scheme is case-insensitive');

for my $p (qw(/v1/completions /v1/responses /tokenize)) {
    is(http('POST', "$base$p", '{}')->{status}, 401, "$p is keyed");
}
is(http('GET', "$base/v1/models")->{status}, 401, '/v1/models is keyed');
is(http('GET', "$base/v1/models/demo")->{status}, 401,
   '/v1/models/{id} is keyed');
is(http('GET', "$base/open/v1/models")->{status}, 200,
   'llm_api_key_required off opens a location');
is(http('GET', "$base/metrics")->{status}, 200, '/metrics open by default');
is(http('GET', "$base/keyed/health")->{status}, 401,
   'llm_api_key_required on keys /health');
is(http('GET', "$base/keyed/health", undef, bearer('sk-test-1'))->{status},
   200, 'keyed /health with the key');
is(http('POST', "$base/v1/chat/completions", '{}',
        { Authorization => 'Bearer sk-test-1' })->{status}, 400,
   'the key is checked before validation');

# ---- Anthropic endpoints -------------------------------------------------
$r = http_json('POST', "$base/v1/messages", $msgs);
is($r->{status}, 401, 'messages without a key: 401');
is_deeply($r->{json}, { type => 'error', error => {
    type => 'authentication_error', message => 'x-api-key header is required' } },
    'messages: Anthropic error shape');
$r = http_json('POST', "$base/v1/messages", $msgs, { 'x-api-key' => 'nope' });
is($r->{status}, 401, 'messages with a wrong x-api-key: 401');
is($r->{json}{error}{message}, 'invalid x-api-key', 'wrong key message');
$r = http_json('POST', "$base/v1/messages", $msgs,
               { 'x-api-key' => 'sk-test-2' });
is($r->{status}, 200, 'messages with x-api-key') or diag($r->{content});
$r = http_json('POST', "$base/v1/messages", $msgs, bearer('key-from-file'));
is($r->{status}, 200, 'messages with Authorization: Bearer');
$r = http_json('POST', "$base/v1/messages/count_tokens", $msgs,
               { 'x-api-key' => 'sk-test-1' });
is($r->{status}, 200, 'count_tokens with x-api-key');
is(http('POST', "$base/v1/messages/count_tokens", $msgs)->{status}, 401,
   'count_tokens is keyed');

# ---- /v1/models/{id} -------------------------------------------------------
my $open_base = "http://127.0.0.1:$port2";
is(http('POST', "$open_base/v1/chat/completions", $chat)->{status}, 200,
   'a server without keys is open');
my $k = bearer('sk-test-1');
$r = http_json('GET', "$base/v1/models/demo", undef, $k);
is($r->{status}, 200, '/v1/models/demo: 200') or diag($r->{content});
my $list = http_json('GET', "$base/v1/models", undef, $k)->{json};
is_deeply($r->{json}, $list->{data}[0], 'the same object as in the list');
is($r->{json}{id}, 'demo', 'id');
is($r->{json}{object}, 'model', 'object: model');
is($r->{json}{owned_by}, 'llm-serve', 'owned_by');
$r = http_json('GET', "$base/v1/models/de%6Do", undef, $k);
is($r->{json}{id}, 'demo', 'the id is percent-decoded');
$r = http_json('GET', "$base/v1/models/nope", undef, $k);
is($r->{status}, 404, 'unknown model: 404');
is($r->{json}{error}{code}, 'model_not_found', 'OpenAI code');
is($r->{json}{error}{param}, 'model', 'param: model');
is($r->{json}{error}{type}, 'invalid_request_error', 'OpenAI type');
like($r->{json}{error}{message}, qr/The model 'nope' does not exist/,
     "OpenAI's message");
$r = http_json('GET', "$base/v1/models/org/demo", undef, $k);
is($r->{status}, 404, 'an id with a slash is looked up whole');
$r = http_json('GET', "$base/v1/models/", undef, $k);
is($r->{json}{object}, 'list', '/v1/models/ is the list');
is(http('POST', "$base/v1/models/demo", '{}', $k)->{status}, 405,
   'POST /v1/models/demo: 405');

# ---- configuration errors ------------------------------------------------
for my $case (["llm_api_key_file $dir/none;", qr/open\(\) ".*none" failed/],
              ["llm_api_key 'a b';", qr/printable ASCII without spaces/]) {
    my $d = scratch_dir();
    open my $e, '>', "$d/empty" or die $!;
    print $e "# nothing\n";
    close $e;
    write_conf($d, "    $case->[0]\n");
    my ($rc, $out) = nginx_test($d);
    isnt($rc, 0, "nginx -t refuses: $case->[0]");
    like($out, $case->[1], 'and says why');
}
my $d = scratch_dir();
open my $e, '>', "$d/empty" or die $!;
print $e "# nothing\n\n";
close $e;
write_conf($d, "    llm_api_key_file $d/empty;\n");
my ($rc, $out) = nginx_test($d);
like($out, qr/holds no key/, 'a key file without keys is refused');

done_testing();
