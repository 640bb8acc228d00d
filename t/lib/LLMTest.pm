package LLMTest;
# Helpers for nginx integration tests: a scratch prefix, a generated
# nginx.conf that loads the module, start/stop of Debian's nginx, engines
# (`llm-engine serve` with the scripted test runner), a tiny HTTP client
# (HTTP::Tiny from Perl core) and a raw one for streams and disconnects.
use strict;
use warnings;
use Exporter 'import';
use File::Temp qw(tempdir);
use IO::Socket::INET;
use HTTP::Tiny;
use Time::HiRes qw(sleep time);
use Cwd qw(abs_path);
use JSON::PP ();
use File::Basename qw(dirname);

our @EXPORT_OK = qw(repo_root build_dir nginx_bin module_path free_port scratch_dir
                    write_conf api_server nginx_test start_nginx stop_nginx http
                    engine_name start_engine stop_engine kill_engine
                    engine_status wait_for raw_open raw_response sse_read
                    http_json);

sub repo_root { abs_path(dirname(__FILE__) . '/../..') }
sub nginx_bin { $ENV{NGINX} // '/usr/sbin/nginx' }
# the build under test: $LLM_BUILD_DIR (make sets it: build, build-asan)
sub build_dir {
    my $d = $ENV{LLM_BUILD_DIR} // 'build';
    return $d =~ m{^/} ? $d : repo_root() . "/$d";
}
sub module_path { build_dir() . '/nginx/ngx_http_llm_module.so' }

sub free_port {
    my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, Proto => 'tcp') or die $!;
    my $p = $s->sockport;
    close $s;
    return $p;
}

sub scratch_dir {
    my $d = tempdir('llm-t-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    mkdir "$d/logs";
    return $d;
}

# write_conf($dir, $http_block, %opt) -> path of nginx.conf
#   log_level => 'debug' (default 'info')
sub write_conf {
    my ($dir, $http, %opt) = @_;
    my $level = $opt{log_level} // 'info';
    my $mod = module_path();
    # workers must map the engine's segment: run them as this user
    my $user = $> == 0 ? 'user root;' : '';
    open my $f, '>', "$dir/nginx.conf" or die $!;
    print $f <<"CONF";
load_module $mod;
daemon on;
master_process on;
$user
worker_processes 2;
error_log $dir/logs/error.log $level;
pid $dir/nginx.pid;
events { worker_connections 256; }
http {
    access_log $dir/logs/access.log;
    client_body_temp_path $dir/body;
$http
}
CONF
    close $f;
    return "$dir/nginx.conf";
}

# where each llm_api usually lives
my %api_location = (
    chat_completions => '= /v1/chat/completions',
    completions      => '= /v1/completions',
    responses        => '= /v1/responses',
    models           => '= /v1/models',
    tokenize         => '= /tokenize',
    detokenize       => '= /detokenize',
    health           => '= /health',
    metrics          => '= /metrics',
    admin            => '/admin/',
    messages         => '= /v1/messages',
    count_tokens     => '= /v1/messages/count_tokens',
);

# api_server($port, \@apis, %opt) -> a server block for write_conf that
# listens on 127.0.0.1:$port and has each llm_api of @apis at its usual
# location
#   listen => 'reuseport'        parameters of the listen directive
#   more => "location / {...}"   lines after the API locations
sub api_server {
    my ($port, $apis, %opt) = @_;
    my $listen = join ' ', "127.0.0.1:$port", $opt{listen} // ();
    my $text = "    server {\n        listen $listen;\n";
    for my $api (@$apis) {
        my $loc = $api_location{$api} // die "no usual location for $api";
        $text .= "        location $loc { llm_api $api; }\n";
    }
    $text .= $opt{more} // '';
    return "$text    }";
}

# nginx -t; returns (exit code, output)
sub nginx_test {
    my ($dir) = @_;
    my $bin = nginx_bin();
    my $out = `$bin -t -p $dir -c $dir/nginx.conf 2>&1`;
    return ($? >> 8, $out);
}

my %nginx_dirs;       # prefixes of running nginx instances

sub start_nginx {
    my ($dir, $port) = @_;
    my $bin = nginx_bin();
    my $out = `$bin -p $dir -c $dir/nginx.conf 2>&1`;
    die "nginx failed to start: $out" if $?;
    $nginx_dirs{$dir} = 1;
    for (1 .. 100) {
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port");
        return 1 if $s;
        sleep 0.05;
    }
    die "nginx is not listening on $port";
}

sub stop_nginx {
    my ($dir) = @_;
    delete $nginx_dirs{$dir};
    open my $f, '<', "$dir/nginx.pid" or return;
    my $pid = <$f>;
    chomp $pid;
    return unless $pid;
    for my $sig ('QUIT', 'TERM') {      # graceful, then fast
        kill $sig, $pid;
        for (1 .. 100) { return unless kill 0, $pid; sleep 0.05; }
    }
    my @workers = grep { /^\d+$/ } map { s/\s//gr } `pgrep -P $pid`;
    kill 'KILL', $pid, @workers;
}

# Hang bounds (not timings) stretch under the sanitizers' slowdown:
# make test-asan sets LLM_TEST_TIME_SCALE (tests/test_env.h does the same
# for the C harness).
sub time_scale { $ENV{LLM_TEST_TIME_SCALE} || 1 }

# http($method, $url, $body, \%headers) -> HTTP::Tiny response hash
sub http {
    my ($method, $url, $body, $headers) = @_;
    my $ua = HTTP::Tiny->new(timeout => 10 * time_scale());
    return $ua->request($method, $url, {
        headers => { 'Content-Type' => 'application/json', %{ $headers // {} } },
        defined $body ? (content => $body) : (),
    });
}

# ---- engines ---------------------------------------------------------------

my %engines;          # pid => [name, dir]

sub engine_bin { build_dir() . '/bin/llm-engine' }
# the test binary: llm-engine plus the scripted runner (tests/engine_test/)
sub engine_test_bin { build_dir() . '/tests/llm-engine-test' }

# engine_name($tag): unique per test run; segments are global (/dev/shm)
sub engine_name { my ($tag) = @_; return "t$$-$tag" }

# start_engine($dir, $name, %recipe) -> pid; waits until the socket exists
sub start_engine {
    my ($dir, $name, %o) = @_;
    my $seqs = $o{max_num_seqs} // 4;
    my $slots = $o{slots} // 16;
    my $served = $o{served} // 'demo';
    # model => DIR serves a real checkpoint with the model runner;
    # otherwise the scripted test runner plays request scripts
    my $model = $o{model} // "/nonexistent/$name";
    my @cmd = $o{model} ? (engine_bin(), 'serve')
                        : (engine_test_bin(), 'serve', '--test-runner', 'scripted');
    open my $f, '>', "$dir/$name.yaml" or die $!;
    print $f <<"YAML";
name: $name
run_dir: $dir
backend: cpu
@{[ $o{extra} // '' ]}
model:
  path: $model
  served_model_name: $served
max_model_len: @{[ $o{max_model_len} // 4096 ]}
max_num_seqs: $seqs
slots: $slots
max_request_bytes: 1MiB
YAML
    close $f;
    unlink "$dir/$name.sock";
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        open STDERR, '>>', "$dir/logs/$name.log";
        open STDOUT, '>', '/dev/null';
        exec @cmd, '--recipe', "$dir/$name.yaml";
        exit 127;
    }
    $engines{$pid} = [$name, $dir];
    wait_for(sub { -S "$dir/$name.sock" }, 10)
        or die "engine $name did not start: " . `cat $dir/logs/$name.log`;
    return $pid;
}

sub _reap {
    my ($pid, $secs) = @_;
    for (1 .. $secs * 20) {
        return 1 if waitpid($pid, 1) == $pid;      # WNOHANG
        sleep 0.05;
    }
    return 0;
}

# stop_engine($pid): SIGTERM drains; a second one stops
sub stop_engine {
    my ($pid) = @_;
    return unless $engines{$pid};
    kill 'TERM', $pid;
    unless (_reap($pid, 5)) {
        kill 'TERM', $pid;
        kill 'KILL', $pid unless _reap($pid, 2);
        _reap($pid, 2);
    }
    delete $engines{$pid};
}

# kill_engine($pid): kill -9, the crash case (leaves its segment behind)
sub kill_engine {
    my ($pid) = @_;
    kill 'KILL', $pid;
    _reap($pid, 5);
    my $e = delete $engines{$pid};
    return $e;
}

# the engine's own view (llm-engine status) as a hash
sub engine_status {
    my ($dir, $name) = @_;
    my $bin = engine_bin();
    my $out = `$bin status --run-dir $dir --name $name 2>/dev/null`;
    return eval { JSON::PP::decode_json($out) };
}

# a test that dies half-way must not leave nginx or engines running
END {
    my $status = $?;
    stop_nginx($_) for keys %nginx_dirs;
    for my $pid (keys %engines) {
        kill 'KILL', $pid;
        waitpid($pid, 0);
        my $name = $engines{$pid}[0];
        unlink glob("/dev/shm/llm-$name-*");
    }
    $? = $status;
}

# wait_for(sub, seconds): poll until true; returns the last value
sub wait_for {
    my ($cond, $secs) = @_;
    my $v;
    for (1 .. ($secs // 5) * 50 * time_scale()) {
        $v = $cond->();
        return $v if $v;
        sleep 0.02;
    }
    return $v;
}

# ---- HTTP ------------------------------------------------------------------

# http_json(...) like http, plus ->{json} decoded (undef if not JSON)
sub http_json {
    my $r = http(@_);
    $r->{json} = eval { JSON::PP::decode_json($r->{content}) };
    return $r;
}

# raw_open($port, $method, $path, $body, \%headers) -> socket, request sent
sub raw_open {
    my ($port, $method, $path, $body, $headers) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => 5) or die "connect: $!";
    $body //= '';
    my $h = join '', map { "$_: $headers->{$_}\r\n" } keys %{ $headers // {} };
    print $s "$method $path HTTP/1.1\r\nHost: localhost\r\n"
           . "Content-Type: application/json\r\nContent-Length: "
           . length($body) . "\r\nConnection: close\r\n$h\r\n$body";
    return $s;
}

sub _read_line {
    my ($s, $deadline) = @_;
    my $line = '';
    while (time() < $deadline) {
        my $rin = '';
        vec($rin, fileno($s), 1) = 1;
        next unless select($rin, undef, undef, 0.05);
        my $n = sysread($s, my $c, 1);
        return $line if !$n;
        $line .= $c;
        return $line if $c eq "\n";
    }
    return $line;
}

sub _read_n {
    my ($s, $n, $deadline) = @_;
    my $buf = '';
    while (length($buf) < $n && time() < $deadline) {
        my $rin = '';
        vec($rin, fileno($s), 1) = 1;
        next unless select($rin, undef, undef, 0.05);
        my $got = sysread($s, $buf, $n - length($buf), length($buf));
        last unless $got;
    }
    return $buf;
}

# raw_response($sock, $timeout) -> {status, headers, body, chunks => [[t, data]]}
# reads the whole response, decoding chunked transfer, timing each chunk
sub raw_response {
    my ($s, $timeout) = @_;
    my $deadline = time() + ($timeout // 10);
    my $status_line = _read_line($s, $deadline);
    my ($status) = $status_line =~ m{^HTTP/1\.\d (\d+)};
    my %h;
    while (defined(my $l = _read_line($s, $deadline))) {
        last if $l eq "\r\n" || $l eq '';
        $h{lc $1} = $2 if $l =~ /^([^:]+):\s*(.*?)\r\n$/;
    }
    my ($body, @chunks) = ('');
    if (($h{'transfer-encoding'} // '') =~ /chunked/) {
        while (time() < $deadline) {
            my $size = _read_line($s, $deadline);
            last if $size eq '';
            $size =~ s/[\r\n;].*//s;
            $size = hex($size);
            last if $size == 0;
            my $data = _read_n($s, $size, $deadline);
            _read_n($s, 2, $deadline);
            push @chunks, [Time::HiRes::time(), $data];
            $body .= $data;
        }
    } elsif (defined $h{'content-length'}) {
        $body = _read_n($s, $h{'content-length'}, $deadline);
    }
    return { status => $status, headers => \%h, body => $body,
             chunks => \@chunks };
}

# sse_read($body) -> list of [event, data] (event undef for chat chunks)
sub sse_read {
    my ($body) = @_;
    my @ev;
    for my $block (split /\n\n/, $body) {
        my ($event, $data);
        for my $l (split /\n/, $block) {
            $event = $1 if $l =~ /^event: (.*)$/;
            $data = $1 if $l =~ /^data: (.*)$/;
        }
        push @ev, [$event, $data] if defined $data;
    }
    return @ev;
}

1;
