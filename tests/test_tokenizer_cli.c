/* llm-engine tokenize / detokenize: output format, modes and errors. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_env.h"
#include "tap.h"
#include "tokenizer.h"

#define BIN build_path("bin/llm-engine")
static const char *TOK = "tests/fixtures/tokenizer/tokenizer.json";

/* Run `BIN args` with input on stdin; capture stdout and stderr. */
static int run(const char *args, const char *in, size_t n, strbuf *out, strbuf *err)
{
    char dir[] = "/tmp/test_tokcli_XXXXXX";
    if (!mkdtemp(dir)) return -1;
    char inp[64], outp[64], errp[64];
    snprintf(inp, sizeof inp, "%s/in", dir);
    snprintf(outp, sizeof outp, "%s/out", dir);
    snprintf(errp, sizeof errp, "%s/err", dir);
    FILE *f = fopen(inp, "wb");
    fwrite(in, 1, n, f);
    fclose(f);
    strbuf cmd;
    sb_init(&cmd);
    sb_printf(&cmd, "%s %s < %s > %s 2> %s", BIN, args, inp, outp, errp);
    int status = system(cmd.data);
    sb_free(&cmd);
    sb_reset(out);
    sb_reset(err);
    sb_read_file(out, outp);
    sb_read_file(err, errp);
    while (err->len && err->data[err->len - 1] == '\n') err->data[--err->len] = 0;
    unlink(inp);
    unlink(outp);
    unlink(errp);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void ids_line(const tokenizer *t, const char *text, bool special, strbuf *line)
{
    tok_ids ids = { 0 };
    tok_encode(t, text, strlen(text), special, &ids);
    sb_reset(line);
    for (size_t i = 0; i < ids.len; i++) sb_printf(line, i ? " %d" : "%d", ids.data[i]);
    sb_putc(line, '\n');
    tok_ids_free(&ids);
}

int main(void)
{
    char e[512];
    tokenizer *t = tok_load(TOK, e, sizeof e);
    if (!ok(t != NULL, "load %s", TOK)) return exit_status();
    strbuf out, err, want, args;
    sb_init(&out);
    sb_init(&err);
    sb_init(&want);
    sb_init(&args);
    const char *text = "Hello, 世界! <｜User｜>hi</think>\n";

    sb_printf(&args, "tokenize --tokenizer %s", TOK);
    int rc = run(args.data, text, strlen(text), &out, &err);
    ids_line(t, text, false, &want);
    ok(rc == 0 && !strcmp(out.data, want.data), "tokenize: ids separated by single spaces, one newline");
    ok(!strstr(out.data, "  ") && out.data[0] != ' ', "no double or leading spaces");
    sb_puts(&args, " --special");
    rc = run(args.data, text, strlen(text), &out, &err);
    ids_line(t, text, true, &want);
    ok(rc == 0 && !strcmp(out.data, want.data), "tokenize --special recognizes added tokens");
    rc = run(args.data, "", 0, &out, &err);
    ok(rc == 0 && !strcmp(out.data, "\n"), "empty input gives an empty line");
    rc = run(args.data, "abc\xC3(", 5, &out, &err);
    ok(rc == 1 && strstr(err.data, "invalid UTF-8 at byte offset 3"), "invalid UTF-8: %s", err.data);
    rc = run("tokenize --tokenizer /nonexistent.json", "a", 1, &out, &err);
    ok(rc == 1 && strstr(err.data, "/nonexistent.json"), "missing tokenizer: %s", err.data);
    rc = run("tokenize --tokenizer", "a", 1, &out, &err);
    ok(rc == 2 && strstr(err.data, "usage"), "missing value is a usage error");
    rc = run("tokenize --tokenizer x --bogus", "a", 1, &out, &err);
    ok(rc == 2 && strstr(err.data, "--bogus"), "unknown flag is a usage error");

    /* detokenize: the --special ids back to the text, streamed. */
    sb_reset(&args);
    sb_printf(&args, "detokenize --tokenizer %s", TOK);
    ids_line(t, text, true, &want);
    rc = run(args.data, want.data, want.len, &out, &err);
    ok(rc == 0 && !strcmp(out.data, text), "detokenize restores the text exactly");
    sb_puts(&args, " --skip-special");
    const char *bos = "0 ";
    strbuf in;
    sb_init(&in);
    sb_printf(&in, "%s%s", bos, want.data);
    rc = run(args.data, in.data, in.len, &out, &err);
    ok(rc == 0 && !strcmp(out.data, text), "--skip-special drops BOS (special), keeps non-special markers");
    sb_reset(&args);
    sb_printf(&args, "detokenize --tokenizer %s", TOK);
    rc = run(args.data, "5 999999999 6", 13, &out, &err);
    ok(rc == 1 && strstr(err.data, "id 999999999") && strstr(err.data, "number 2"), "invalid id: %s", err.data);
    rc = run(args.data, "5 x7 6", 6, &out, &err);
    ok(rc == 1 && strstr(err.data, "\"x7\" at byte offset 2"), "non-number: %s", err.data);
    rc = run(args.data, "  \n", 3, &out, &err);
    ok(rc == 0 && out.len == 0, "no ids, no text");

    sb_free(&in);
    sb_free(&out);
    sb_free(&err);
    sb_free(&want);
    sb_free(&args);
    tok_free(t);
    return exit_status();
}
