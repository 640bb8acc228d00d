/* Validation against the JSON-schema subset tool definitions use here:
 * type (object, array, string, number, integer, boolean, null, or a list
 * of these), properties, required, enum, items, additionalProperties:
 * false.  Other keywords are ignored (they constrain nothing we check). */
#ifndef QUALIFY_SCHEMA_H
#define QUALIFY_SCHEMA_H

#include <yajl/yajl_tree.h>

#include "strbuf.h"

/* 0 when value satisfies schema; else -1 and the first violation in why,
 * naming its path ("$.unit: \"kelvin\" is not one of [...]"). */
int schema_validate(yajl_val schema, yajl_val value, strbuf *why);

#endif
