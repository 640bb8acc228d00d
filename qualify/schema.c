#include "schema.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

static int type_is(const char *type, yajl_val v)
{
    if (!strcmp(type, "object")) return YAJL_IS_OBJECT(v);
    if (!strcmp(type, "array")) return YAJL_IS_ARRAY(v);
    if (!strcmp(type, "string")) return YAJL_IS_STRING(v);
    if (!strcmp(type, "number")) return YAJL_IS_NUMBER(v);
    if (!strcmp(type, "boolean")) return YAJL_IS_TRUE(v) || YAJL_IS_FALSE(v);
    if (!strcmp(type, "null")) return YAJL_IS_NULL(v);
    if (!strcmp(type, "integer")) {
        double d;
        return json_number(v, &d) && isfinite(d) && floor(d) == d;
    }
    return 0;
}

/* Structural equality, for enum (numbers compared by value). */
static int json_equal(yajl_val a, yajl_val b)
{
    double x, y;
    if (json_number(a, &x) && json_number(b, &y)) return x == y;
    if (YAJL_IS_STRING(a) && YAJL_IS_STRING(b)) return !strcmp(a->u.string, b->u.string);
    if (YAJL_IS_TRUE(a) || YAJL_IS_FALSE(a) || YAJL_IS_NULL(a)) return a->type == b->type;
    if (YAJL_IS_ARRAY(a) && YAJL_IS_ARRAY(b)) {
        if (a->u.array.len != b->u.array.len) return 0;
        for (size_t i = 0; i < a->u.array.len; i++)
            if (!json_equal(a->u.array.values[i], b->u.array.values[i])) return 0;
        return 1;
    }
    if (YAJL_IS_OBJECT(a) && YAJL_IS_OBJECT(b)) {
        if (a->u.object.len != b->u.object.len) return 0;
        for (size_t i = 0; i < a->u.object.len; i++) {
            yajl_val bv = json_get(b, a->u.object.keys[i]);
            if (!bv || !json_equal(a->u.object.values[i], bv)) return 0;
        }
        return 1;
    }
    return 0;
}

static void put_value(strbuf *sb, yajl_val v)
{
    strbuf tmp;
    sb_init(&tmp);
    json_dump(&tmp, v, JSON_COMPACT);
    if (tmp.len > 80) sb_printf(sb, "%.77s...", tmp.data);
    else sb_puts(sb, tmp.data);
    sb_free(&tmp);
}

static int check(yajl_val schema, yajl_val v, const char *path, strbuf *why)
{
    if (!YAJL_IS_OBJECT(schema)) return 0;   /* true / {} accept anything */
    yajl_val type = json_get(schema, "type");
    if (type) {
        int okay = 0;
        if (json_string(type)) {
            okay = type_is(type->u.string, v);
        } else if (YAJL_IS_ARRAY(type)) {
            for (size_t i = 0; i < type->u.array.len && !okay; i++)
                okay = json_string(type->u.array.values[i])
                       && type_is(type->u.array.values[i]->u.string, v);
        }
        if (!okay) {
            sb_printf(why, "%s: ", path);
            put_value(why, v);
            sb_puts(why, " is not of type ");
            put_value(why, type);
            return -1;
        }
    }
    yajl_val en = json_get(schema, "enum");
    if (YAJL_IS_ARRAY(en)) {
        int found = 0;
        for (size_t i = 0; i < en->u.array.len && !found; i++)
            found = json_equal(en->u.array.values[i], v);
        if (!found) {
            sb_printf(why, "%s: ", path);
            put_value(why, v);
            sb_puts(why, " is not one of ");
            put_value(why, en);
            return -1;
        }
    }
    if (YAJL_IS_OBJECT(v)) {
        yajl_val req = json_get(schema, "required");
        for (size_t i = 0; YAJL_IS_ARRAY(req) && i < req->u.array.len; i++) {
            const char *k = json_string(req->u.array.values[i]);
            if (k && !json_get(v, k)) {
                sb_printf(why, "%s: required property \"%s\" is missing", path, k);
                return -1;
            }
        }
        yajl_val props = json_get(schema, "properties");
        yajl_val extra = json_get(schema, "additionalProperties");
        for (size_t i = 0; i < v->u.object.len; i++) {
            const char *k = v->u.object.keys[i];
            yajl_val sub = json_get(props, k);
            char sub_path[512];
            snprintf(sub_path, sizeof sub_path, "%s.%s", path, k);
            if (sub) {
                if (check(sub, v->u.object.values[i], sub_path, why) < 0) return -1;
            } else if (YAJL_IS_FALSE(extra)) {
                sb_printf(why, "%s: property \"%s\" is not allowed", path, k);
                return -1;
            }
        }
    }
    yajl_val items = json_get(schema, "items");
    if (YAJL_IS_ARRAY(v) && items) {
        for (size_t i = 0; i < v->u.array.len; i++) {
            char sub_path[512];
            snprintf(sub_path, sizeof sub_path, "%s[%zu]", path, i);
            if (check(items, v->u.array.values[i], sub_path, why) < 0) return -1;
        }
    }
    return 0;
}

int schema_validate(yajl_val schema, yajl_val value, strbuf *why)
{
    return check(schema, value, "$", why);
}
