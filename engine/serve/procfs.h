/* Process facts from kill(2) and /proc: is a pid alive, and who has a
 * /dev/shm file open or mapped.  Used to reclaim what dead processes
 * left behind without ever touching what a live one uses. */
#ifndef LLM_PROCFS_H
#define LLM_PROCFS_H

#include <stdbool.h>
#include <sys/types.h>

/* True if pid exists and is not a zombie (a zombie has closed its files). */
bool pid_alive(pid_t pid);

/* Processes other than this one that map or hold open /dev/shm/<file>
 * (from /proc/PID/maps and /proc/PID/fd).  Stores up to max pids, returns
 * how many there are; *unknown is set when a live process allows neither
 * view (no permission), so it might be a user. */
int shm_users(const char *file, pid_t *pids, int max, bool *unknown);

#endif
