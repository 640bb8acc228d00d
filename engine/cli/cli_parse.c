/* llm-engine parse --mode thinking|chat: completion text on stdin, the
 * parsed message on stdout as {"content","reasoning_content","tool_calls"}.
 * A completion that ends in EOS stopped; one that does not was cut by the
 * token limit (that only changes the finish reason, which is not printed). */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "cli.h"
#include "output_parser.h"

static uint64_t os_random(void *ctx)
{
    (void)ctx;
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) perror("parse: getrandom");
    return v;
}

int cmd_parse(int argc, char **argv)
{
    const char *mode = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[++i];
        else mode = "";
    }
    if (!mode || (strcmp(mode, "thinking") && strcmp(mode, "chat"))) {
        fprintf(stderr, "usage: llm-engine parse --mode thinking|chat  (completion on stdin)\n");
        return 2;
    }
    parsed_message m;
    parsed_message_init(&m);
    output_parser *p = output_parser_new(!strcmp(mode, "thinking"),
                                         parsed_message_on_event, &m, os_random, NULL);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) output_parser_feed(p, buf, n);
    int rc = 0;
    if (ferror(stdin)) {
        perror("parse: stdin");
        rc = 1;
    } else {
        output_parser_finish(p, GEN_LENGTH);   /* an EOS in the text makes it a stop */
        strbuf out;
        sb_init(&out);
        parsed_message_json(&m, &out);
        sb_putc(&out, '\n');
        sb_fwrite(&out, stdout);
        sb_free(&out);
        if (fflush(stdout)) {
            perror("parse: stdout");
            rc = 1;
        }
    }
    output_parser_free(p);
    parsed_message_free(&m);
    return rc;
}
