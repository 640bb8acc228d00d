# The module loads into Debian's stock nginx, registers its directives,
# rejects bad ones, and its API locations answer with OpenAI error bodies.
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf nginx_test start_nginx stop_nginx
               http free_port module_path);
use JSON::PP;

ok(-f module_path(), 'module built') or BAIL_OUT('run make module');

my $dir = scratch_dir();
my $port = free_port();
write_conf($dir, <<"CONF");
    llm_engine demo run_dir=$dir;
    server {
        listen 127.0.0.1:$port;
        location /v1/chat/completions { llm_api chat_completions; }
    }
CONF
my ($rc, $out) = nginx_test($dir);
is($rc, 0, 'nginx -t accepts load_module and the llm directives') or diag($out);

start_nginx($dir, $port);
my $r = http('POST', "http://127.0.0.1:$port/v1/chat/completions", '{}');
is($r->{status}, 400, 'API location validates the request');
my $body = eval { decode_json($r->{content}) };
ok($body && $body->{error} && $body->{error}{message}, 'OpenAI error body')
    or diag($r->{content});
stop_nginx($dir);

my $dir2 = scratch_dir();
write_conf($dir2, <<"CONF");
    server {
        listen 127.0.0.1:$port;
        location / { llm_api teleport; }
    }
CONF
($rc, $out) = nginx_test($dir2);
isnt($rc, 0, 'unknown llm_api value is rejected');
like($out, qr/unknown llm_api "teleport"/, 'error names the bad value');

write_conf($dir2, "    llm_engine demo /tmp;\n");
($rc, $out) = nginx_test($dir2);
isnt($rc, 0, 'llm_engine without run_dir= is rejected');
like($out, qr/expected run_dir=DIR/, 'error says what is expected');

done_testing();
