#include "prompts.h"

#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "json.h"
#include "schema.h"

#define WEATHER_SCHEMA                                                                     \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":"  \
    "\"City name, e.g. Paris\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","      \
    "\"fahrenheit\"]}},\"required\":[\"city\"],\"additionalProperties\":false}"

const char weather_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
    "\"Get the current weather for a city.\",\"parameters\":" WEATHER_SCHEMA "}}]";
const char weather_choice[] = "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}";

bool contains_ci(const char *hay, const char *needle)
{
    if (!hay) return false;
    size_t n = strlen(needle);
    for (; *hay; hay++)
        if (!strncasecmp(hay, needle, n)) return true;
    return false;
}

int check_weather_call(const chat_tool_call *c, const char *city, strbuf *why)
{
    if (strcmp(c->name.data ? c->name.data : "", "get_weather")) {
        sb_printf(why, "called \"%s\", not get_weather", c->name.data ? c->name.data : "");
        return -1;
    }
    char err[256];
    yajl_val args = json_parse(c->args.data ? c->args.data : "", c->args.len, err, sizeof err);
    yajl_val schema = json_parse(WEATHER_SCHEMA, strlen(WEATHER_SCHEMA), err, sizeof err);
    int rc = -1;
    if (!args) {
        sb_printf(why, "arguments are not JSON (%s): %.120s", err, c->args.data ? c->args.data : "");
    } else if (schema_validate(schema, args, why) == 0) {
        const char *got = json_string(json_get(args, "city"));
        if (city && !contains_ci(got, city)) sb_printf(why, "city is \"%s\", not %s", got, city);
        else rc = 0;
    }
    yajl_tree_free(args);
    yajl_tree_free(schema);
    return rc;
}

void output_check(qctx *q, gate *g, bool good, const char *name, const char *fmt, ...)
{
    strbuf d;
    sb_init(&d);
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(&d, fmt, ap);
    va_end(ap);
    enum gate_status st = good ? ST_PASS : q->model_is_random ? ST_NOT_MEANINGFUL : ST_FAIL;
    gate_check(g, st, name, "%s%s", d.data ? d.data : "",
               st == ST_NOT_MEANINGFUL ? " (--model-is-random: not meaningful)" : "");
    sb_free(&d);
}

long gen_budget(qctx *q)
{
    long b = q->quality_max_tokens;
    if (q->max_model_len && b > q->max_model_len / 2) b = q->max_model_len / 2;
    return b > 0 ? b : 1;
}
