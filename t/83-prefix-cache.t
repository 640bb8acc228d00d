# Prefix caching through nginx with the demo model (tests/fixtures/demo,
# CPU): a conversation's next turn, which repeats the first turn's long
# prompt, reports usage.prompt_tokens_details.cached_tokens > 0 and gives
# the same greedy output as a cold engine (enable_prefix_caching: false);
# so do the Responses API and Anthropic's Messages API (cache reads apart
# from input_tokens); the metrics count the hits; /admin/reset_prefix_cache
# empties the cache (the next repeat reuses nothing and answers the same).
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use LLMTest qw(repo_root scratch_dir write_conf start_nginx http http_json
               free_port engine_name start_engine wait_for api_server);
use JSON::PP;

my $top = repo_root();
my $dir = scratch_dir();
my $port = free_port();
my $warm = engine_name('pcwarm');
my $cold = engine_name('pccold');
start_engine($dir, $warm, model => "$top/tests/fixtures/demo", served => 'demo',
             extra => "kv_cache_memory_bytes: 64MiB");
start_engine($dir, $cold, model => "$top/tests/fixtures/demo", served => 'cold',
             extra => "kv_cache_memory_bytes: 64MiB\nenable_prefix_caching: false");
my $server = api_server($port, [qw(chat_completions responses messages health
                                   metrics admin)]);
write_conf($dir, <<"CONF");
    llm_engine $warm run_dir=$dir;
    llm_engine $cold run_dir=$dir;
    llm_health interval=100ms passes=1;
    llm_admin_token sekrit;
$server
CONF
start_nginx($dir, $port);
my $base = "http://127.0.0.1:$port";
ok(wait_for(sub { http('GET', "$base/health")->{status} == 200 }, 20),
   'both engines become healthy')
    or BAIL_OUT('engines never became healthy');

sub post { http_json('POST', "$base$_[0]", encode_json($_[1])) }

my $system = join ' ', map { "Rule $_: answer briefly, cite the manual, and never "
                             . "guess a part number." } 1 .. 40;
my @turn1 = ({ role => 'system', content => $system },
             { role => 'user', content => 'How do I reset the pump?' });
my %gen = (max_tokens => 6, temperature => 0);

my $r1 = post('/v1/chat/completions', { %gen, model => 'demo', messages => \@turn1 });
is($r1->{status}, 200, 'first turn: 200') or diag($r1->{content});
my $u1 = $r1->{json}{usage};
cmp_ok($u1->{prompt_tokens}, '>', 300, "a long prompt ($u1->{prompt_tokens} tokens)");
is($u1->{prompt_tokens_details}{cached_tokens}, 0, 'first turn: nothing cached');

my @turn2 = (@turn1,
             { role => 'assistant', content => $r1->{json}{choices}[0]{message}{content} },
             { role => 'user', content => 'And the filter?' });
my $w = post('/v1/chat/completions', { %gen, model => 'demo', messages => \@turn2 });
my $c = post('/v1/chat/completions', { %gen, model => 'cold', messages => \@turn2 });
is($w->{status}, 200, 'second turn: 200') or diag($w->{content});
my $cached = $w->{json}{usage}{prompt_tokens_details}{cached_tokens} // 0;
cmp_ok($cached, '>', 0, "second turn: $cached prompt tokens from the cache");
ok($cached % 128 == 0 && $cached < $u1->{prompt_tokens},
   'whole blocks of the first turn\'s prompt');
is($c->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'the cold engine reuses nothing');
is($w->{json}{choices}[0]{message}{content}, $c->{json}{choices}[0]{message}{content},
   'the same greedy output as the cold engine');
is($w->{json}{usage}{prompt_tokens}, $c->{json}{usage}{prompt_tokens},
   'prompt_tokens counts the whole prompt');

# the same prompt again through the Responses API
my %rin = (max_output_tokens => 6, temperature => 0,
           instructions => $system, input => 'How do I reset the pump?');
my $rw = post('/v1/responses', { %rin, model => 'demo' });
my $rw2 = post('/v1/responses', { %rin, model => 'demo' });
my $rc = post('/v1/responses', { %rin, model => 'cold' });
is($rw2->{status}, 200, 'responses: 200') or diag($rw2->{content});
cmp_ok($rw2->{json}{usage}{input_tokens_details}{cached_tokens} // 0, '>', 0,
       'responses: a repeated input reports cached_tokens');
sub text_of { $_[0]{json}{output}[0]{content}[0]{text} }
ok(defined text_of($rw2) && text_of($rw2) eq text_of($rc) && text_of($rw) eq text_of($rc),
   'responses: the same output as the cold engine');

# Anthropic's Messages API counts cache reads apart from input_tokens
my %ant = (max_tokens => 6, temperature => 0, system => $system,
           messages => [{ role => 'user', content => 'How do I reset the pump?' }]);
my $a1 = post('/v1/messages', { %ant, model => 'demo' });
my $ac = post('/v1/messages', { %ant, model => 'cold' });
my $au = $a1->{json}{usage} // {};
is($a1->{status}, 200, 'messages: 200') or diag($a1->{content});
cmp_ok($au->{cache_read_input_tokens} // 0, '>', 0,
       'messages: cache_read_input_tokens of a repeated prompt');
is(($au->{input_tokens} // 0) + ($au->{cache_read_input_tokens} // 0),
   $ac->{json}{usage}{input_tokens}, 'messages: input + cache_read = the whole prompt');
is($a1->{json}{content}[0]{text}, $ac->{json}{content}[0]{text},
   'messages: the same output as the cold engine');

my $m = http('GET', "$base/metrics")->{content};
my ($hits) = $m =~ /^llm_engine_prefix_cache_hit_tokens\{engine="\Q$warm\E"\} (\d+)/m;
my ($queries) = $m =~ /^llm_engine_prefix_cache_queries\{engine="\Q$warm\E"\} (\d+)/m;
ok(defined $hits && $hits >= $cached && $queries >= 4,
   'metrics: hit tokens and queries') or diag($m);

# /admin/reset_prefix_cache: authenticated, POST, one engine
my $auth = { Authorization => 'Bearer sekrit' };
sub reset_cache { http_json('POST', "$base/admin/reset_prefix_cache$_[0]", '', $_[1] // $auth) }
is(reset_cache("?engine=$warm", {})->{status}, 401, 'reset: the admin token is required');
is(http('GET', "$base/admin/reset_prefix_cache?engine=$warm", undef, $auth)->{status}, 405,
   'reset: GET is refused');
is(reset_cache('')->{status}, 400, 'reset: the engine must be named');
is(reset_cache('?engine=nope')->{status}, 404, 'reset: an unknown engine is a 404');
my $x = reset_cache("?engine=$warm");
is($x->{status}, 200, 'reset: 200') or diag($x->{content});
my $freed = $x->{json}{freed} // {};
ok($x->{json}{engine} eq $warm && $freed->{entries} > 0 && $freed->{blocks} > 0
   && defined $freed->{host_entries} && defined $freed->{host_bytes}
   && defined $freed->{disk_files},
   "reset: says what it freed ($freed->{entries} entries, $freed->{blocks} blocks)")
    or diag($x->{content});
my $w2 = post('/v1/chat/completions', { %gen, model => 'demo', messages => \@turn2 });
is($w2->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'after the reset the repeated prompt reuses nothing');
is($w2->{json}{choices}[0]{message}{content}, $c->{json}{choices}[0]{message}{content},
   'and answers as the cold engine does');
my $w3 = post('/v1/chat/completions', { %gen, model => 'demo', messages => \@turn2 });
cmp_ok($w3->{json}{usage}{prompt_tokens_details}{cached_tokens} // 0, '>', 0,
       'the cache fills again after a reset');
my $again = reset_cache("?engine=$warm")->{json}{freed} // {};
my $none = reset_cache("?engine=$cold");
ok($again->{entries} > 0 && $none->{status} == 200 && $none->{json}{freed}{entries} == 0
   && $none->{json}{freed}{blocks} == 0, 'a second reset frees the new entries; an engine '
   . 'without prefix caching frees nothing') or diag($none->{content});

done_testing();
