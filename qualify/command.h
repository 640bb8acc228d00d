/* Run a local program (the engine binary's janitor, status, version) with
 * the running gate's deadline, capturing its output. */
#ifndef QUALIFY_COMMAND_H
#define QUALIFY_COMMAND_H

#include "qualify.h"

/* argv[0] is the program (no shell).  stdout and stderr go to out.
 * 0 when it exited 0 in time; else -1 with the reason in why. */
int run_command(qctx *q, char *const argv[], strbuf *out, strbuf *why);

#endif
