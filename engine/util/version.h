/* Engine identity: version and build description, reported by
 * `llm-engine version`, the segment header and the qualification report. */
#ifndef LLM_VERSION_H
#define LLM_VERSION_H

#define LLM_ENGINE_VERSION "0.1.0"

/* "0.1.0 (git abc1234, gcc 12.2.0, cuda)" */
const char *llm_engine_build(void);

#endif
