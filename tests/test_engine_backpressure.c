/* A slow reader: the engine keeps generating into the sequence's overflow
 * buffer, pauses it when that is full, serves other requests meanwhile,
 * and delivers every event, in order, as the reader catches up. */
#include "tap.h"
#include "engine_harness.h"

int main(void)
{
    h_init("backpressure");
    const char *name = h_name("bp");
    h_start_engine(name, h_recipe(name, 4, 8, "max_model_len: 1000000\nkv_cache_memory_bytes: 1GiB\n"));
    llm_ipc_client c;
    if (h_ready(&c, name)) return exit_status();
    /* 25,000 numbered pieces "000123-é世|": 250,000 tokens, 325,000 bytes,
     * five times the 64 KiB ring. */
    enum { PIECES = 25000 };
    strbuf want, body;
    sb_init(&want);
    sb_init(&body);
    for (int i = 0; i < PIECES; i++) sb_printf(&want, "%06d-é世|", i);
    sb_printf(&body, "{\"max_tokens\":300000,\"test_script\":{\"content\":\"%s\","
              "\"tokens_per_step\":3000}}", want.data);
    llm_ipc_handle slow;
    is_int(h_submit(&c, &slow, body.data, LLM_KIND_CHAT), 0, "submit a 250,000-token stream");

    strbuf got;
    sb_init(&got);
    static unsigned char buf[LLM_IPC_EVENT_MAX];
    uint64_t max_paused = 0;
    int finish = 0, other_done = 0, events = 0, bad = 0;
    long end = h_now_ms() + 15000;
    while (!finish && h_now_ms() < end) {
        uint64_t p = h_counter(&c, LLM_CTR_PAUSED);
        if (p > max_paused) max_paused = p;
        if (max_paused && !other_done) {
            /* While the slow stream is paused, another request still runs. */
            llm_ipc_handle quick;
            strbuf qc;
            sb_init(&qc);
            h_submit(&c, &quick, "{\"test_script\":{\"content\":\"not blocked\",\"tokens_per_step\":4}}",
                     LLM_KIND_CHAT);
            other_done = h_collect(&c, &quick, 3000, NULL, &qc) == LLM_FINISH_STOP
                         && !strcmp(qc.data, "not blocked");
            llm_ipc_release(&c, &quick);
            sb_free(&qc);
            if (!other_done) other_done = -1;
        }
        long n = llm_ipc_read_events(&c, &slow, buf, sizeof buf);   /* at most ~8 KiB a read */
        size_t off = 0;
        llm_ipc_event ev;
        int r;
        while (n > 0 && (r = llm_ipc_event_next(buf, (size_t)n, &off, &ev)) == 1) {
            events++;
            if (ev.type == LLM_EV_CONTENT_DELTA) sb_append(&got, ev.text, ev.text_len);
            else if (ev.type == LLM_EV_FINISH) finish = (int)ev.reason;
            else if (ev.type != LLM_EV_PROMPT_INFO && ev.type != LLM_EV_USAGE) bad++;
        }
        if (n < 0) bad++;
        h_sleep_ms(5);                    /* the slow part */
    }
    ok(max_paused >= 1, "the engine paused the slow reader's sequence (paused counter %llu)",
       (unsigned long long)max_paused);
    is_int(other_done, 1, "another request completed while it was paused");
    is_int(finish, LLM_FINISH_STOP, "the slow stream finishes");
    is_int(bad, 0, "no unexpected or corrupt events");
    is_int(got.len, want.len, "every content byte arrived (%zu of %zu)", got.len, want.len);
    ok(got.data && !strcmp(got.data, want.data), "in order, byte for byte (%d events)", events);
    llm_ipc_release(&c, &slow);
    is_int(h_counter(&c, LLM_CTR_TOKENS_OUT) >= PIECES * 10, 1, "tokens_out counts the 250,000 tokens");
    llm_ipc_detach(&c);
    sb_free(&want);
    sb_free(&body);
    sb_free(&got);
    return exit_status();
}
