# Hostile input: mutated and random request bodies against every
# generating endpoint.  Each must get an OpenAI error (or pass validation
# to the 503 of an engine that is not running), never a crash, a hang or a
# 500; the worker processes must survive.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx free_port
               api_server);
use JSON::PP;
use HTTP::Tiny;

my $dir = scratch_dir();
my $port = free_port();
my $server = api_server($port, [qw(chat_completions completions responses
                                   tokenize detokenize)]);
write_conf($dir, <<"CONF");
    llm_engine e1 run_dir=$dir;
    llm_route demo e1;
    llm_max_body_size 64k;
$server
CONF
start_nginx($dir, $port);

srand(20260829);
my $ua = HTTP::Tiny->new(timeout => 5, keep_alive => 0);

my @seeds = (
    ['/v1/chat/completions', { model => 'demo', stream => JSON::PP::true,
        messages => [{ role => 'system', content => 'be brief' },
                     { role => 'user', content => [{ type => 'text', text => "h\x{e9}" }] },
                     { role => 'assistant', content => undef, tool_calls => [
                        { id => 'c', type => 'function',
                          function => { name => 'f', arguments => '{"a":[1,2]}' } }] },
                     { role => 'tool', tool_call_id => 'c', content => 'r' }],
        tools => [{ type => 'function', function => { name => 'f',
                    parameters => { type => 'object', properties => {} } } }],
        tool_choice => 'auto', temperature => 0.7, stop => ['x'],
        response_format => { type => 'json_schema',
                             json_schema => { name => 's', schema => {} } },
        chat_template_kwargs => { thinking => JSON::PP::true } }],
    ['/v1/completions', { model => 'demo', prompt => [1, 2, 3], max_tokens => 4,
                          logprobs => 2, seed => 7 }],
    ['/v1/responses', { model => 'demo', instructions => 'i',
        input => [{ role => 'user', content => [{ type => 'input_text', text => 'q' }] },
                  { type => 'function_call', call_id => 'c', name => 'f', arguments => '{}' },
                  { type => 'function_call_output', call_id => 'c', output => 'o' }],
        tools => [{ type => 'function', name => 'f' }], reasoning => { effort => 'high' } }],
    ['/tokenize', { model => 'demo', messages => [{ role => 'user', content => 'm' }] }],
    ['/detokenize', { model => 'demo', tokens => [1, 2, 3] }],
);

my @values = (undef, JSON::PP::true, JSON::PP::false, 0, -1, 1e308, -1e308,
              1.5, 9223372036854775808, "", "x" x 300, "\x{0}", [], {},
              [undef], { a => [] }, "\x{202e}\x{feff}", 'auto', 'function');

# a fresh copy of a random value (shared refs would nest into themselves)
sub value {
    my $v = $values[rand @values];
    return (ref $v && !JSON::PP::is_bool($v)) ? decode_json(encode_json($v)) : $v;
}

# replace a random node of the tree with a random value
sub mutate {
    my ($v) = @_;
    if (ref $v eq 'HASH' && %$v) {
        my @k = keys %$v;
        my $k = $k[rand @k];
        if (rand() < 0.4) { $v->{$k} = value() }
        else { mutate($v->{$k}) }
        $v->{ 'k' . int(rand 9) } = value() if rand() < 0.1;
    } elsif (ref $v eq 'ARRAY' && @$v) {
        my $i = int rand @$v;
        if (rand() < 0.4) { $v->[$i] = value() }
        else { mutate($v->[$i]) }
    }
}

my ($n, $bad) = (0, 0);
for my $round (1 .. 150) {
    for my $seed (@seeds) {
        my ($path, $body) = @$seed;
        my $copy = decode_json(encode_json($body));
        mutate($copy) for 1 .. 1 + int rand 3;
        my $text = encode_json($copy);
        my $k = rand();
        if ($k < 0.15) {          # truncate
            $text = substr($text, 0, int rand length $text);
        } elsif ($k < 0.3) {      # flip bytes
            for (1 .. 1 + int rand 4) {
                substr($text, int rand length $text, 1) = chr(int rand 256);
            }
        }
        my $r = $ua->request('POST', "http://127.0.0.1:$port$path",
                             { headers => { 'Content-Type' => 'application/json' },
                               content => $text });
        $n++;
        my $e = eval { decode_json($r->{content})->{error} };
        unless ($r->{status} =~ /^(400|404|503)$/ && $e && defined $e->{message}) {
            $bad++;
            diag("$path: $r->{status} $r->{content}\n  body: $text") if $bad <= 5;
        }
    }
}
is($bad, 0, "$n mutated requests: every answer an OpenAI 400/404/503 error");

my $log = `cat $dir/logs/error.log`;
unlike($log, qr/signal \d+ \(SIG(SEGV|ABRT|BUS)\)|exited on signal/,
       'no worker crashed');
unlike($log, qr/\[alert\]/, 'no alerts');

stop_nginx($dir);
done_testing();
