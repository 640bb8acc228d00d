# The shared zone: the module keeps nginx's slab pool header intact.  Its
# log context (the zone name in slab error messages) must live in a slab
# allocation; written through the pool's own `log_ctx`, which points at the
# one-byte `zero` field of the header, it overwrote `data`, `addr` and the
# first slot list.  The test reads the zone out of the running master's
# memory and finds where the zone name lies.
use strict;
use warnings;
no warnings 'portable';     # 64-bit addresses from hex
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(scratch_dir write_conf start_nginx stop_nginx free_port
               api_server);

my $dir = scratch_dir();
my $port = free_port();
my $server = api_server($port, [qw(chat_completions)]);
write_conf($dir, <<"CONF");
    llm_engine demo run_dir=$dir;
    llm_route demo demo;
    llm_zone 1m;
$server
CONF
start_nginx($dir, $port);
open my $pf, '<', "$dir/nginx.pid" or die $!;
chomp(my $pid = <$pf>);

# nginx maps a zone as shared anonymous memory ("/dev/zero (deleted)")
my $zone;
open my $maps, '<', "/proc/$pid/maps" or die "maps: $!";
while (<$maps>) {
    next unless /^([0-9a-f]+)-([0-9a-f]+) rw-s .*\/dev\/zero/;
    my ($start, $end) = (hex $1, hex $2);
    $zone = $start if $end - $start == 1024 * 1024;
}
ok(defined $zone, 'the 1m llm zone is mapped in the master');

SKIP: {
    skip "cannot read /proc/$pid/mem: $!", 2
        unless defined $zone && open(my $mem, '<', "/proc/$pid/mem");
    sysseek($mem, $zone, 0) or die "seek: $!";
    my $n = sysread($mem, my $bytes, 1024 * 1024);
    is($n, 1024 * 1024, 'read the zone');
    my $at = index($bytes, ' in llm zone "');
    # the slab pool header (ngx_slab_pool_t) is ~200 bytes, followed by
    # its slot lists; slab allocations start on the pages after them
    cmp_ok($at, '>=', 4096, 'the zone name lies in a slab allocation, '
           . 'not over the slab pool header') or diag("found at $at");
}

stop_nginx($dir);
done_testing();
