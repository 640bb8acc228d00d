/* Orphaned segment reclamation (the "guarded two-scan" rule): a segment
 * /dev/shm/llm-* whose engine pid is dead and that no process maps or
 * holds open is recorded on its first orphaned scan and removed on the
 * second consecutive one.  Nothing live is touched.  The record lives in
 * <run_dir>/janitor.state. */
#ifndef LLM_JANITOR_H
#define LLM_JANITOR_H

#include "strbuf.h"

/* One scan.  Appends one JSON line per segment seen to out ("action":
 * kept | recorded | removed).  Returns 0, or -1 with a reason in err. */
int janitor_scan(const char *run_dir, strbuf *out, strbuf *err);

#endif
