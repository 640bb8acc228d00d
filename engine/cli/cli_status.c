/* llm-engine status --run-dir DIR --name NAME: the engine's header as one
 * JSON object (state, epoch, pid, heartbeat age, limits, counters). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ipc/llm_ipc_client.h"
#include "json.h"
#include "procfs.h"

static const char usage_text[] = "usage: llm-engine status --run-dir DIR --name NAME\n";

int cmd_status(int argc, char **argv)
{
    const char *run_dir = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
        else if (!strcmp(argv[i], "--name") && i + 1 < argc) name = argv[++i];
        else {
            fprintf(stderr, "status: unexpected argument '%s'\n%s", argv[i], usage_text);
            return 2;
        }
    }
    if (!name) {
        fputs(usage_text, stderr);
        return 2;
    }
    llm_ipc_client c;
    char err[256];
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"name\":");
    json_put_cstr(&sb, name);
    if (llm_ipc_attach(&c, run_dir, name, 1, err, sizeof err) < 0) {
        sb_puts(&sb, ",\"state\":\"absent\",\"error\":");
        json_put_cstr(&sb, err);
        sb_puts(&sb, "}\n");
        fputs(sb.data, stdout);
        sb_free(&sb);
        return 1;
    }
    llm_ipc_header *h = c.hdr;
    uint32_t st = llm_ipc_engine_state(&c);
    sb_puts(&sb, ",\"state\":");
    json_put_cstr(&sb, llm_ipc_state_name(st));
    sb_puts(&sb, ",\"state_msg\":");
    json_put_cstr(&sb, h->state_msg);
    sb_printf(&sb, ",\"epoch\":\"%016llx\",\"pid\":%d,\"pid_alive\":%s,\"heartbeat_age_ms\":%lld",
              (unsigned long long)h->epoch, h->pid, pid_alive(h->pid) ? "true" : "false",
              (long long)llm_ipc_heartbeat_age_ms(&c));
    sb_printf(&sb, ",\"progress_age_ms\":%lld", (long long)llm_ipc_progress_age_ms(&c));
    sb_printf(&sb, ",\"started_unix_ms\":%llu", (unsigned long long)(h->start_unix_ns / 1000000));
    sb_puts(&sb, ",\"models\":[");
    for (uint32_t i = 0; i < h->n_models && i < LLM_IPC_MODELS_MAX; i++) {
        if (i) sb_putc(&sb, ',');
        json_put_string(&sb, h->models[i], strnlen(h->models[i], LLM_IPC_MODEL_MAX));
    }
    sb_puts(&sb, "],\"fingerprint\":");
    json_put_string(&sb, h->fingerprint, strnlen(h->fingerprint, LLM_IPC_FINGERPRINT));
    sb_printf(&sb, ",\"limits\":{\"max_model_len\":%u,\"max_num_seqs\":%u,"
              "\"max_num_batched_tokens\":%u,\"slots\":%u,\"max_request_bytes\":%llu,"
              "\"ring_bytes\":%u}", h->max_model_len, h->max_num_seqs,
              h->max_num_batched_tokens, h->n_slots, (unsigned long long)h->max_request_bytes,
              h->ring_bytes);
    uint64_t ctr[LLM_CTR_N];
    llm_ipc_counters(&c, ctr);
    for (int i = 0; i < LLM_CTR_N; i++)
        sb_printf(&sb, ",\"%s\":%llu", llm_ipc_counter_name((uint32_t)i), (unsigned long long)ctr[i]);
    uint32_t per_state[LLM_SLOT_CANCELLED + 1] = { 0 };
    for (uint32_t k = 0; k < h->n_slots; k++) {
        uint64_t w = atomic_load_explicit(&llm_ipc_slot_at(h, k)->word, memory_order_relaxed);
        if (LLM_SLOT_STATE(w) <= LLM_SLOT_CANCELLED) per_state[LLM_SLOT_STATE(w)]++;
    }
    sb_puts(&sb, ",\"slot_states\":{");
    for (uint32_t s = 0; s <= LLM_SLOT_CANCELLED; s++)
        sb_printf(&sb, "%s\"%s\":%u", s ? "," : "", llm_ipc_slot_state_name(s), per_state[s]);
    sb_puts(&sb, "}}\n");
    fputs(sb.data, stdout);
    sb_free(&sb);
    llm_ipc_detach(&c);
    return 0;
}
