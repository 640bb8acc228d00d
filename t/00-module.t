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

my @bad = (
    ["    llm_engine demo run_dir=/tmp;\n    llm_engine demo run_dir=/tmp;\n",
     qr/duplicate engine "demo"/, 'duplicate engine'],
    ["    llm_engine 'a b' run_dir=/tmp;\n", qr/invalid engine name/,
     'engine name with a space'],
    ["    llm_engine demo run_dir=/tmp fingerprint=xyz;\n",
     qr/fingerprint=HEX/, 'bad fingerprint'],
    ["    llm_engine demo run_dir=/tmp;\n    llm_route m nope;\n",
     qr/llm_route "m" names unknown engine "nope"/, 'route to an unknown engine'],
    ["    llm_engine demo run_dir=/tmp;\n    llm_health interval=soon;\n",
     qr/invalid value in "interval=soon"/, 'bad llm_health value'],
    ["    llm_engine demo run_dir=/tmp;\n    llm_health speed=1;\n",
     qr/invalid parameter "speed=1"/, 'unknown llm_health parameter'],
    ["    llm_engine demo run_dir=/tmp;\n    llm_queue 5 wait=1s;\n",
     qr/expected timeout=TIME/, 'bad llm_queue parameter'],
    ["    server { listen 127.0.0.1:$port; location / { llm_api health; } }\n",
     qr/"llm_api health" needs at least one llm_engine/, 'llm_api without engines'],
    ["    llm_admin_token change-me;\n",
     qr/llm_admin_token "change-me" is a placeholder/, 'placeholder admin token'],
    ["    server { location /a/ { llm_admin_token CHANGEME; } }\n",
     qr/llm_admin_token "CHANGEME" is a placeholder/, 'placeholder token, any case'],
);
for my $b (@bad) {
    write_conf($dir2, $b->[0]);
    ($rc, $out) = nginx_test($dir2);
    isnt($rc, 0, "$b->[2] is rejected");
    like($out, $b->[1], "$b->[2]: the error says why");
}

# the example configuration stays valid
# (with the module of the build under test: make test-asan's is its own)
my $root = LLMTest::repo_root();
mkdir "$root/build";
mkdir "$root/build/run";
open my $in, '<', "$root/conf/nginx.conf" or die $!;
my $example = do { local $/; <$in> };
close $in;
my $mod = LLMTest::module_path();
$example =~ s{^load_module \S+;}{load_module $mod;}m or die 'no load_module';
open my $ex, '>', "$dir2/example.conf" or die $!;
print $ex $example;
close $ex;
# its includes sit beside it
system('cp', "$root/conf/llm_error_pages.conf", $dir2) == 0 or die 'cp llm_error_pages.conf';
my $bin = LLMTest::nginx_bin();
$out = `$bin -t -p $root -c $dir2/example.conf 2>&1`;
is($?, 0, 'conf/nginx.conf passes nginx -t') or diag($out);

done_testing();
