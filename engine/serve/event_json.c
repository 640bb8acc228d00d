#include "event_json.h"

#include "json.h"

static void key(strbuf *sb, const char *k)
{
    sb_printf(sb, ",\"%s\":", k);
}

void event_to_json(strbuf *sb, const llm_ipc_event *ev)
{
    sb_puts(sb, "{\"type\":");
    json_put_cstr(sb, llm_ipc_event_name(ev->type));
    if (ev->choice || ev->choice_end) sb_printf(sb, ",\"choice\":%u", ev->choice);
    if (ev->choice_end) sb_puts(sb, ",\"choice_end\":true");
    switch (ev->type) {
    case LLM_EV_REASONING_DELTA:
    case LLM_EV_CONTENT_DELTA:
        key(sb, "text");
        json_put_string(sb, ev->text, ev->text_len);
        break;
    case LLM_EV_TOOL_CALL_BEGIN:
        sb_printf(sb, ",\"index\":%u", ev->index);
        key(sb, "id");
        json_put_string(sb, ev->id, ev->id_len);
        key(sb, "name");
        json_put_string(sb, ev->name, ev->name_len);
        break;
    case LLM_EV_TOOL_CALL_ARGS:
        sb_printf(sb, ",\"index\":%u", ev->index);
        key(sb, "text");
        json_put_string(sb, ev->text, ev->text_len);
        break;
    case LLM_EV_TOOL_CALL_END:
        sb_printf(sb, ",\"index\":%u", ev->index);
        break;
    case LLM_EV_FINISH:
        key(sb, "reason");
        json_put_cstr(sb, llm_ipc_finish_name(ev->reason));
        if (ev->stop) sb_printf(sb, ",\"stop\":%u", ev->stop - 1);
        break;
    case LLM_EV_USAGE:
        sb_printf(sb, ",\"prompt_tokens\":%u,\"completion_tokens\":%u,\"reasoning_tokens\":%u,"
                  "\"cached_tokens\":%u", ev->usage.prompt_tokens, ev->usage.completion_tokens,
                  ev->usage.reasoning_tokens, ev->usage.cached_tokens);
        break;
    case LLM_EV_ERROR:
        sb_printf(sb, ",\"status\":%u", ev->status);
        key(sb, "code");
        json_put_string(sb, ev->code, ev->code_len);
        key(sb, "param");
        json_put_string(sb, ev->param, ev->param_len);
        key(sb, "message");
        json_put_string(sb, ev->text, ev->text_len);
        break;
    case LLM_EV_PROMPT_INFO:
        sb_printf(sb, ",\"prompt_tokens\":%u,\"cached_tokens\":%u,\"fingerprint\":\"%016llx\"",
                  ev->prompt_tokens, ev->cached_tokens, (unsigned long long)ev->fingerprint);
        break;
    case LLM_EV_TOKENS:
        sb_puts(sb, ",\"ids\":[");
        for (uint32_t i = 0; i < ev->n_items; i++)
            sb_printf(sb, "%s%u", i ? "," : "", llm_ipc_event_token(ev, i));
        sb_putc(sb, ']');
        break;
    case LLM_EV_LOGPROB: {
        sb_printf(sb, ",\"token_id\":%u,\"logprob\":", ev->token_id);
        json_put_double(sb, ev->logprob);
        key(sb, "bytes");
        json_put_string(sb, ev->text, ev->text_len);
        sb_puts(sb, ",\"top\":[");
        size_t pos = 0, len;
        float lp;
        const char *b;
        for (int i = 0; llm_ipc_event_top(ev, &pos, &lp, &b, &len); i++) {
            sb_printf(sb, "%s{\"logprob\":", i ? "," : "");
            json_put_double(sb, lp);
            key(sb, "bytes");
            json_put_string(sb, b, len);
            sb_putc(sb, '}');
        }
        sb_putc(sb, ']');
        break;
    }
    default:
        break;
    }
    sb_putc(sb, '}');
}
