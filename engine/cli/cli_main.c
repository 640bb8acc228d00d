/* The llm-engine command table and dispatcher (docs/ARCHITECTURE.md, CLI).
 * main.c calls it for build/bin/llm-engine; tests/engine_test/main.c
 * for the test binary, adding its test-only commands. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const cli_command commands[] = {
    { "check", cmd_check, "check --recipe FILE          validate a recipe" },
    { "version", cmd_version, "version                      build identity and devices" },
    { "serve", cmd_serve, "serve --recipe FILE [--run-dir DIR] [--name NAME]   run the engine daemon" },
    { "status", cmd_status, "status --run-dir DIR --name NAME   an engine's state and counters as JSON" },
    { "client", cmd_client, "client --run-dir DIR --name NAME --request FILE [--kind KIND]   one request, events as JSON lines" },
    { "janitor", cmd_janitor, "janitor --run-dir DIR        one scan for orphaned engine segments" },
    { "render", cmd_render, "render --request FILE        OpenAI chat request -> prompt text" },
    { "parse", cmd_parse, "parse --mode thinking|chat   completion on stdin -> message JSON" },
    { "tokenize", cmd_tokenize, "tokenize --tokenizer FILE [--special]   text (stdin) -> ids" },
    { "detokenize", cmd_detokenize, "detokenize --tokenizer FILE [--skip-special]   ids (stdin) -> text" },
    { "bench-mask", cmd_bench_mask, "bench-mask --tokenizer FILE --request FILE [--walks N]   constrained decoding cost per token" },
    { "bench-tokenizer", cmd_bench_tokenizer, "bench-tokenizer --tokenizer FILE --text FILE [--repeat N]" },
    { "logits", cmd_logits, "logits --model DIR --ids 1,2,3 [--tp N] [--mode full|incremental] --out FILE" },
    { "bench", cmd_bench, "bench --model DIR | --synthetic CONFIG [--backend B] [--tp N] [--prompts N,..]  prefill/decode tokens/s" },
    { "synth", cmd_synth, "synth --out DIR [--preset tiny|mid]   write a synthetic V4 checkpoint" },
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f, const cli_command *extra, size_t n_extra)
{
    fprintf(f, "usage: llm-engine COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %s\n", commands[i].usage);
    for (size_t i = 0; i < n_extra; i++) fprintf(f, "  %s\n", extra[i].usage);
}

int cli_main(int argc, char **argv, const cli_command *extra, size_t n_extra)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout, extra, n_extra);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    for (size_t i = 0; i < n_extra; i++)
        if (!strcmp(argv[1], extra[i].name)) return extra[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "llm-engine: unknown command '%s'\n", argv[1]);
    usage(stderr, extra, n_extra);
    return 2;
}
