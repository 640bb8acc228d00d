/* The DeepSeek V4-0731 encoder: the same steps as DeepSeek's
 * encode_messages (merge tool results into user turns, order them by the
 * calls, drop old reasoning, render each turn and its transition), writing
 * each piece as template text or request text so the prompt can be
 * tokenized safely. */
#include <stdlib.h>
#include <string.h>

#include "chat_render.h"
#include "json.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define USER "<｜User｜>"
#define ASSISTANT "<｜Assistant｜>"
#define LATEST_REMINDER "<｜latest_reminder｜>"
#define THINK_START "<think>"
#define THINK_END "</think>"
#define DSML "｜DSML｜"

static const char *const task_tokens[] = {
    [CHAT_TASK_ACTION] = "<｜action｜>", [CHAT_TASK_QUERY] = "<｜query｜>",
    [CHAT_TASK_AUTHORITY] = "<｜authority｜>", [CHAT_TASK_DOMAIN] = "<｜domain｜>",
    [CHAT_TASK_TITLE] = "<｜title｜>", [CHAT_TASK_READ_URL] = "<｜read_url｜>",
};

const char *const chat_special_strings[] = {
    BOS, EOS, USER, ASSISTANT, LATEST_REMINDER, THINK_START, THINK_END,
    "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
    "<｜title｜>", "<｜read_url｜>",
};
const size_t chat_n_special_strings =
    sizeof chat_special_strings / sizeof chat_special_strings[0];

/* Prepended right after BOS in thinking mode; low adds nothing. */
static const char *const effort_prompts[] = {
    [CHAT_EFFORT_LOW] = "",
    [CHAT_EFFORT_HIGH] =
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose "
        "the problem to resolve the root cause, rigorously stress-testing your logic "
        "against all potential paths, edge cases, and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every "
        "intermediate step, considered alternative, and rejected hypothesis to "
        "ensure absolutely no assumption is left unchecked.\n\n",
    [CHAT_EFFORT_MAX] =
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing "
        "to chance: exhaustively decompose the problem into its most fundamental "
        "components, trace every causal chain to its root, and resolve the "
        "underlying cause rather than any surface symptom.\n"
        "Do not stop reasoning until you have independently verified the solution "
        "from multiple angles and are certain that no assumption remains unchecked "
        "and no error remains undiscovered.\n\n",
};

static const char tools_head[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You "
    "can invoke tools by writing a \"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For "
    "all other types (numbers, booleans, arrays, objects), pass the value in JSON "
    "format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " THINK_START "), you MUST output "
    "your complete reasoning inside " THINK_START "..." THINK_END " BEFORE any tool "
    "calls or final response.\n\n"
    "Otherwise, output directly after " THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter "
    "schemas to invoke tool calls.\n";
static const char response_format_head[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* ---- the prompt and its spans ---- */

void chat_prompt_init(chat_prompt *p)
{
    memset(p, 0, sizeof *p);
    sb_init(&p->text);
}

void chat_prompt_free(chat_prompt *p)
{
    sb_free(&p->text);
    free(p->origin);
    free(p->spans);
    chat_prompt_init(p);
}

/* Append a span, merging it into the last one when it is of the same kind. */
static void span_add(chat_span **v, size_t *n, size_t *cap, size_t off,
                     size_t len, bool special_ok)
{
    if (!len) return;
    if (*n && (*v)[*n - 1].special_ok == special_ok
        && (*v)[*n - 1].off + (*v)[*n - 1].len == off) {
        (*v)[*n - 1].len += len;
        return;
    }
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 32;
        *v = realloc(*v, *cap * sizeof **v);
        if (!*v) abort();
    }
    (*v)[(*n)++] = (chat_span){ off, len, special_ok };
}

static void put(chat_prompt *p, const char *s, size_t n, bool tpl)
{
    span_add(&p->origin, &p->n_origin, &p->cap_origin, p->text.len, n, tpl);
    sb_append(&p->text, s, n);
}

static void tpl(chat_prompt *p, const char *s) { put(p, s, strlen(s), true); }
static void txt(chat_prompt *p, const char *s) { put(p, s, strlen(s), false); }

void chat_prompt_segment(chat_prompt *p, const char *const *specials, size_t n)
{
    p->n_spans = 0;
    const char *t = p->text.data;
    for (size_t k = 0; k < p->n_origin; k++) {
        chat_span o = p->origin[k];
        if (!o.special_ok) {
            span_add(&p->spans, &p->n_spans, &p->cap_spans, o.off, o.len, false);
            continue;
        }
        size_t i = o.off, end = o.off + o.len, from = o.off;
        while (i < end) {
            size_t best = 0;   /* longest special string starting at i */
            for (size_t s = 0; s < n; s++) {
                size_t l = strlen(specials[s]);
                if (l > best && l <= end - i && !memcmp(t + i, specials[s], l)) best = l;
            }
            if (!best) { i++; continue; }
            span_add(&p->spans, &p->n_spans, &p->cap_spans, from, i - from, false);
            span_add(&p->spans, &p->n_spans, &p->cap_spans, i, best, true);
            i += best;
            from = i;
        }
        span_add(&p->spans, &p->n_spans, &p->cap_spans, from, end - from, false);
    }
}

/* ---- encoder steps ---- */

/* A turn after merging: user turns gather consecutive user texts and tool
 * results as blocks (blocks[first .. first + n_blocks)); other roles are one
 * message each. */
typedef struct {
    enum chat_role role;
    const chat_message *msg;     /* non-user turns */
    size_t first, n_blocks;      /* user turns */
    enum chat_task task;
} turn;

typedef struct {
    turn *turns;
    size_t n;
    const chat_message **blocks;   /* user text (CHAT_USER) or tool result (CHAT_TOOL) */
    size_t n_blocks;
} merged;

static void merge_turns(const chat_conversation *c, merged *mg)
{
    mg->turns = calloc(c->n ? c->n : 1, sizeof *mg->turns);
    mg->blocks = calloc(c->n ? c->n : 1, sizeof *mg->blocks);
    if (!mg->turns || !mg->blocks) abort();
    mg->n = mg->n_blocks = 0;
    for (size_t i = 0; i < c->n; i++) {
        const chat_message *m = &c->msgs[i];
        turn *last = mg->n ? &mg->turns[mg->n - 1] : NULL;
        bool user_side = m->role == CHAT_USER || m->role == CHAT_TOOL;
        /* A tool result joins any open user turn; user text only one that
         * carries no task (the later message's task is then lost, as in
         * the encoder). */
        if (user_side && last && last->role == CHAT_USER
            && (m->role == CHAT_TOOL || last->task == CHAT_TASK_NONE)) {
            last->n_blocks++;
            mg->blocks[mg->n_blocks++] = m;
            continue;
        }
        turn *t = &mg->turns[mg->n++];
        if (user_side) {
            *t = (turn){ .role = CHAT_USER, .first = mg->n_blocks, .n_blocks = 1,
                         .task = m->role == CHAT_USER ? m->task : CHAT_TASK_NONE };
            mg->blocks[mg->n_blocks++] = m;
        } else {
            *t = (turn){ .role = m->role, .msg = m, .task = m->task };
        }
    }
}

typedef struct { long key; size_t pos; const chat_message *m; } keyed;

static int keyed_cmp(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* The position of the call a tool result answers in the latest assistant
 * message with tool calls (the last call with that id), or 0; empty ids
 * never match (the encoder skips them). */
static long call_order(const chat_message *calls, const char *id)
{
    if (!id || !*id) return 0;
    for (size_t k = calls->n_calls; k-- > 0;)
        if (calls->calls[k].id && !strcmp(calls->calls[k].id, id)) return (long)k;
    return 0;
}

static bool has_call_ids(const chat_message *m)
{
    for (size_t k = 0; k < m->n_calls; k++)
        if (m->calls[k].id && *m->calls[k].id) return true;
    return false;
}

/* Tool results of a user turn are reordered, among the block positions they
 * hold, by the order of the calls they answer. */
static void sort_tool_results(merged *mg)
{
    const chat_message *calls = NULL;
    keyed *tmp = calloc(mg->n_blocks ? mg->n_blocks : 1, sizeof *tmp);
    if (!tmp) abort();
    for (size_t i = 0; i < mg->n; i++) {
        turn *t = &mg->turns[i];
        if (t->role == CHAT_ASSISTANT && t->msg->n_calls) {
            calls = has_call_ids(t->msg) ? t->msg : NULL;
            continue;
        }
        if (t->role != CHAT_USER || !calls) continue;
        size_t nt = 0;
        for (size_t b = t->first; b < t->first + t->n_blocks; b++) {
            const chat_message *m = mg->blocks[b];
            if (m->role != CHAT_TOOL) continue;
            tmp[nt] = (keyed){ call_order(calls, m->tool_call_id), nt, m };
            nt++;
        }
        if (nt < 2) continue;
        qsort(tmp, nt, sizeof *tmp, keyed_cmp);
        size_t k = 0;
        for (size_t b = t->first; b < t->first + t->n_blocks; b++)
            if (mg->blocks[b]->role == CHAT_TOOL) mg->blocks[b] = tmp[k++].m;
    }
    free(tmp);
}

static long last_user_index(const merged *mg)
{
    for (size_t i = mg->n; i-- > 0;)
        if (mg->turns[i].role == CHAT_USER || mg->turns[i].role == CHAT_DEVELOPER)
            return (long)i;
    return -1;
}

/* drop_thinking in thinking mode also drops developer turns that come
 * before the last user turn. */
static void drop_old_developer_turns(merged *mg)
{
    long last = last_user_index(mg);
    size_t k = 0;
    for (size_t i = 0; i < mg->n; i++)
        if (!(mg->turns[i].role == CHAT_DEVELOPER && (long)i < last))
            mg->turns[k++] = mg->turns[i];
    mg->n = k;
}

static bool any_tools(const merged *mg)
{
    for (size_t i = 0; i < mg->n; i++) {
        const turn *t = &mg->turns[i];
        if (t->role != CHAT_USER && t->msg->tools && json_len(t->msg->tools)) return true;
    }
    return false;
}

/* ---- rendering ---- */

static void put_json(chat_prompt *p, yajl_val v)
{
    strbuf sb;
    sb_init(&sb);
    json_dump(&sb, v, JSON_PYTHON);
    put(p, sb.data, sb.len, false);
    sb_free(&sb);
}

static void render_tools(chat_prompt *p, yajl_val tools)
{
    tpl(p, tools_head);
    for (size_t j = 0; j < tools->u.array.len; j++) {
        if (j) tpl(p, "\n");
        put_json(p, json_get(tools->u.array.values[j], "function"));
    }
    tpl(p, tools_tail);
}

/* The tools and response format a system or developer message carries. */
static void render_attachments(chat_prompt *p, const chat_message *m)
{
    if (m->tools && json_len(m->tools)) {
        tpl(p, "\n\n");
        render_tools(p, m->tools);
    }
    if (m->response_format && json_len(m->response_format)) {
        tpl(p, "\n\n");
        tpl(p, response_format_head);
        put_json(p, m->response_format);
    }
}

static void render_tool_call(chat_prompt *p, const chat_tool_call *call)
{
    tpl(p, "<" DSML "invoke name=\"");
    txt(p, call->name);
    tpl(p, "\">\n");
    yajl_val a = call->args;
    size_t *slot = json_object_slots(a);
    bool first = true;
    for (size_t i = 0; i < a->u.object.len; i++) {
        size_t j = slot ? slot[i] : i;
        if (j == a->u.object.len) continue;
        yajl_val v = a->u.object.values[j];
        if (!first) tpl(p, "\n");
        first = false;
        tpl(p, "<" DSML "parameter name=\"");
        txt(p, a->u.object.keys[i]);
        tpl(p, YAJL_IS_STRING(v) ? "\" string=\"true\">" : "\" string=\"false\">");
        if (YAJL_IS_STRING(v)) txt(p, v->u.string);
        else put_json(p, v);
        tpl(p, "</" DSML "parameter>");
    }
    free(slot);
    tpl(p, "\n</" DSML "invoke>");
}

static void render_assistant(chat_prompt *p, const chat_message *m, bool reasoning)
{
    if (reasoning) {
        txt(p, m->reasoning ? m->reasoning : "");
        tpl(p, THINK_END);
    }
    txt(p, m->content);
    if (m->n_calls) {
        tpl(p, "\n\n<" DSML "tool_calls>\n");
        for (size_t k = 0; k < m->n_calls; k++) {
            if (k) tpl(p, "\n");
            render_tool_call(p, &m->calls[k]);
        }
        tpl(p, "\n</" DSML "tool_calls>");
    }
    if (!m->wo_eos) tpl(p, EOS);
}

static void render_user(chat_prompt *p, const merged *mg, const turn *t)
{
    tpl(p, USER);
    for (size_t b = t->first; b < t->first + t->n_blocks; b++) {
        const chat_message *m = mg->blocks[b];
        if (b > t->first) tpl(p, "\n\n");
        if (m->role == CHAT_TOOL) tpl(p, "<tool_result>");
        txt(p, m->content);
        if (m->role == CHAT_TOOL) tpl(p, "</tool_result>");
    }
}

int chat_render(const chat_conversation *c, const chat_options *o,
                chat_prompt *p, chat_error *err)
{
    chat_prompt_free(p);
    merged mg;
    merge_turns(c, &mg);
    sort_tool_results(&mg);
    bool drop = o->drop_thinking && !any_tools(&mg);
    if (o->thinking && drop) drop_old_developer_turns(&mg);
    long last_user = last_user_index(&mg);

    tpl(p, BOS);
    for (size_t i = 0; i < mg.n; i++) {
        const turn *t = &mg.turns[i];
        const chat_message *m = t->msg;
        if (i == 0 && o->thinking) tpl(p, effort_prompts[o->effort]);
        switch (t->role) {
        case CHAT_SYSTEM:
            txt(p, m->content);
            render_attachments(p, m);
            break;
        case CHAT_DEVELOPER:
            tpl(p, USER);
            txt(p, m->content);
            render_attachments(p, m);
            break;
        case CHAT_USER:
            render_user(p, &mg, t);
            break;
        case CHAT_LATEST_REMINDER:
            tpl(p, LATEST_REMINDER);
            txt(p, m->content);
            break;
        case CHAT_ASSISTANT: {
            /* A turn answering a task carries no reasoning. */
            bool after_task = i > 0 && mg.turns[i - 1].task != CHAT_TASK_NONE;
            render_assistant(p, m, o->thinking && !after_task
                                   && (!drop || (long)i > last_user));
            break;
        }
        case CHAT_TOOL:   /* merged into user turns above */
            break;
        }

        /* The transition into the next assistant turn (or the generation
         * prompt at the end); nothing when a user-side turn follows. */
        enum chat_role next = i + 1 < mg.n ? mg.turns[i + 1].role : CHAT_ASSISTANT;
        if (next != CHAT_ASSISTANT && next != CHAT_LATEST_REMINDER) continue;
        if (t->task != CHAT_TASK_NONE) {
            if (t->task == CHAT_TASK_ACTION) {
                tpl(p, ASSISTANT);
                tpl(p, o->thinking ? THINK_START : THINK_END);
            }
            tpl(p, task_tokens[t->task]);
        } else if (t->role == CHAT_USER || t->role == CHAT_DEVELOPER) {
            tpl(p, ASSISTANT);
            tpl(p, o->thinking && (!drop || (long)i >= last_user) ? THINK_START : THINK_END);
        }
    }
    free(mg.turns);
    free(mg.blocks);

    if (p->text.len > CHAT_MAX_PROMPT_BYTES) {
        chat_fail(err, "messages", "the rendered prompt is %zu bytes, over the limit of %zu",
                  p->text.len, CHAT_MAX_PROMPT_BYTES);
        return -1;
    }
    chat_prompt_segment(p, chat_special_strings, chat_n_special_strings);
    return 0;
}

bool chat_effort_from_name(const char *name, enum chat_effort *out)
{
    if (!strcmp(name, "none")) return false;
    if (!strcmp(name, "medium") || !strcmp(name, "high")) *out = CHAT_EFFORT_HIGH;
    else if (!strcmp(name, "xhigh") || !strcmp(name, "max")) *out = CHAT_EFFORT_MAX;
    else *out = CHAT_EFFORT_LOW;
    return true;
}
