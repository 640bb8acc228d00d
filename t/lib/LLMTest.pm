package LLMTest;
# Helpers for nginx integration tests: a scratch prefix, a generated
# nginx.conf that loads the module, start/stop of Debian's nginx, and a
# tiny HTTP client (HTTP::Tiny from Perl core).
use strict;
use warnings;
use Exporter 'import';
use File::Temp qw(tempdir);
use IO::Socket::INET;
use HTTP::Tiny;
use Time::HiRes qw(sleep);
use Cwd qw(abs_path);
use File::Basename qw(dirname);

our @EXPORT_OK = qw(repo_root nginx_bin module_path free_port scratch_dir
                    write_conf nginx_test start_nginx stop_nginx http);

sub repo_root { abs_path(dirname(__FILE__) . '/../..') }
sub nginx_bin { $ENV{NGINX} // '/usr/sbin/nginx' }
sub module_path { repo_root() . '/build/nginx/ngx_http_llm_module.so' }

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

# write_conf($dir, $http_block) -> path of nginx.conf
sub write_conf {
    my ($dir, $http) = @_;
    my $mod = module_path();
    open my $f, '>', "$dir/nginx.conf" or die $!;
    print $f <<"CONF";
load_module $mod;
daemon on;
master_process on;
worker_processes 2;
error_log $dir/logs/error.log info;
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

# nginx -t; returns (exit code, output)
sub nginx_test {
    my ($dir) = @_;
    my $bin = nginx_bin();
    my $out = `$bin -t -p $dir -c $dir/nginx.conf 2>&1`;
    return ($? >> 8, $out);
}

sub start_nginx {
    my ($dir, $port) = @_;
    my $bin = nginx_bin();
    my $out = `$bin -p $dir -c $dir/nginx.conf 2>&1`;
    die "nginx failed to start: $out" if $?;
    for (1 .. 100) {
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port");
        return 1 if $s;
        sleep 0.05;
    }
    die "nginx is not listening on $port";
}

sub stop_nginx {
    my ($dir) = @_;
    open my $f, '<', "$dir/nginx.pid" or return;
    my $pid = <$f>;
    chomp $pid;
    kill 'QUIT', $pid;
    for (1 .. 100) { last unless kill 0, $pid; sleep 0.05; }
    kill 'KILL', $pid if kill 0, $pid;
}

# http($method, $url, $body, \%headers) -> HTTP::Tiny response hash
sub http {
    my ($method, $url, $body, $headers) = @_;
    my $ua = HTTP::Tiny->new(timeout => 10);
    return $ua->request($method, $url, {
        headers => { 'Content-Type' => 'application/json', %{ $headers // {} } },
        defined $body ? (content => $body) : (),
    });
}

1;
