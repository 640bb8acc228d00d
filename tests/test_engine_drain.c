/* SIGTERM drain: the running request finishes whole, the waiting one and
 * new claims are refused (503 engine_draining / not ready), then the
 * engine goes STOPPED, removes its segment and socket and exits 0.  A
 * second SIGTERM stops at once with an error event. */
#include "tap.h"
#include "engine_harness.h"

static void test_drain(void)
{
    const char *name = h_name("drain");
    pid_t eng = h_start_engine(name, h_recipe(name, 1, 8, NULL));
    llm_ipc_client c;
    if (h_ready(&c, name)) return;
    const char *want = "the running request is allowed to finish every token";
    char body[256];
    snprintf(body, sizeof body, "{\"test_script\":{\"content\":\"%s\",\"tokens_per_step\":2,"
             "\"step_ms\":10}}", want);
    llm_ipc_handle a, b, x;
    h_submit(&c, &a, body, LLM_KIND_CHAT);
    h_submit(&c, &b, body, LLM_KIND_CHAT);
    long t0 = h_now_ms();
    while (llm_ipc_slot_state(&c, &a) != LLM_SLOT_RUNNING && h_now_ms() - t0 < 3000) h_sleep_ms(2);
    is_int(llm_ipc_slot_state(&c, &b), LLM_SLOT_SUBMITTED, "max_num_seqs 1: the second request waits");

    kill(eng, SIGTERM);
    t0 = h_now_ms();
    while (llm_ipc_engine_state(&c) != LLM_STATE_DRAINING && h_now_ms() - t0 < 3000) h_sleep_ms(1);
    is_int(llm_ipc_engine_state(&c), LLM_STATE_DRAINING, "SIGTERM: state DRAINING");
    ok(strstr(c.hdr->state_msg, "draining") != NULL, "with a reason: %s", c.hdr->state_msg);
    is_int(llm_ipc_claim(&c, &x), LLM_IPC_ENOTREADY, "new claims are refused while draining");

    strbuf out, content;
    sb_init(&out);
    sb_init(&content);
    is_int(h_collect(&c, &b, 3000, &out, NULL), LLM_FINISH_ERROR, "the waiting request is refused");
    ok(strstr(out.data, "\"status\":503,\"code\":\"engine_draining\"") != NULL, "with 503 engine_draining");
    llm_ipc_release(&c, &b);
    is_int(h_collect(&c, &a, 5000, NULL, &content), LLM_FINISH_STOP, "the running request finishes");
    is_str(content.data, want, "with all of its output");
    llm_ipc_release(&c, &a);

    is_int(h_wait_exit(eng, 5000), 0, "then the engine exits 0");
    is_int(llm_ipc_engine_state(&c), LLM_STATE_STOPPED, "state STOPPED");
    char shm[LLM_IPC_SHM_NAME_MAX], sock[320];
    llm_ipc_shm_name(shm, h_run_dir, name);
    snprintf(sock, sizeof sock, "%s/%s.sock", h_run_dir, name);
    int fd = shm_open(shm, O_RDONLY, 0);
    ok(fd < 0 && errno == ENOENT, "the segment is removed");
    if (fd >= 0) close(fd);
    ok(access(sock, F_OK) < 0, "the socket is removed");
    llm_ipc_msg m[8];
    int r = 0;
    for (int i = 0; i < 20 && r >= 0; i++) r = llm_ipc_recv(&c, m, 8);
    is_int(r, LLM_IPC_EDEAD, "the client sees the socket closed");
    llm_ipc_detach(&c);
    sb_free(&out);
    sb_free(&content);
}

static void test_forced_stop(void)
{
    const char *name = h_name("stop");
    pid_t eng = h_start_engine(name, h_recipe(name, 1, 8, NULL));
    llm_ipc_client c;
    if (h_ready(&c, name)) return;
    llm_ipc_handle a;
    h_submit(&c, &a, "{\"test_script\":{\"content\":\"this would take a long time to say\","
                     "\"step_ms\":50}}", LLM_KIND_CHAT);
    long t0 = h_now_ms();
    while (llm_ipc_slot_state(&c, &a) != LLM_SLOT_RUNNING && h_now_ms() - t0 < 3000) h_sleep_ms(2);
    kill(eng, SIGTERM);
    while (llm_ipc_engine_state(&c) != LLM_STATE_DRAINING && h_now_ms() - t0 < 3000) h_sleep_ms(1);
    kill(eng, SIGTERM);
    strbuf out;
    sb_init(&out);
    is_int(h_collect(&c, &a, 3000, &out, NULL), LLM_FINISH_ERROR, "a second SIGTERM ends running requests now");
    ok(strstr(out.data, "\"status\":503,\"code\":\"engine_stopped\"") != NULL, "with 503 engine_stopped");
    is_int(h_wait_exit(eng, 3000), 0, "and the engine exits 0");
    llm_ipc_detach(&c);
    sb_free(&out);
}

int main(void)
{
    h_init("drain");
    test_drain();
    test_forced_stop();
    return exit_status();
}
