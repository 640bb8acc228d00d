#!/usr/bin/env python3
"""Synthetic chat data for the trained demo model (issue 19), deterministic
by seed, rendered and tokenized by the engine itself.

    python3 tools/demo_data.py train --seed 19 --n 24000 --out train.bin
    python3 tools/demo_data.py eval  --seed 19 --out eval.jsonl

Every conversation is an OpenAI chat request; `llm-engine render --ids`
turns it into the exact ids serving would see, so training and serving
agree byte for byte, except that the last assistant turn (what the model
writes) has every number one digit a token (split_digits).  The loss
mask covers that turn: after its `<｜Assistant｜>` and think marker,
through the EOS.

What makes a 6M-parameter model get answers right rather than near:
sums, differences and products come with digit-wise working (columns
with carries and borrows; a numbered run of multiples), which the model
writes before the result (or in the reasoning block when thinking), and
most tool arguments, code words and spelled words are made-up words
(made_word), so the model learns to copy what the user wrote instead of
recalling a similar trained string.

train.bin (little-endian): b"DV4DATA1", u32 count, then per example u32 n,
n u16 ids, n u8 mask (1 = predict this token).

eval.jsonl: held-out prompts, one JSON object a line: "kind", "request"
(the chat request, no answer), "prompt_ids", "expect" (what scoring needs).
Held out from training: operand pairs of the arithmetic (a hash of the pair),
weather cities, made-up words (a hash of the word), calculator operand
pairs, dictionary words and booking (restaurant, party size) combinations.

Only the Python standard library; the engine does the text work.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import random
import struct
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(TOP, "build/bin/llm-engine")
TOKENIZER = os.path.join(TOP, "tests/fixtures/tokenizer/tokenizer.json")
ASSISTANT_ID, EOS_ID = 3906, 1
MAGIC = b"DV4DATA1"

# ------------------------------------------------------------------ tables --
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"),
            ("Germany", "Berlin"), ("Spain", "Madrid"), ("Egypt", "Cairo"),
            ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"),
            ("Norway", "Oslo"), ("Greece", "Athens"), ("Chile", "Santiago"),
            ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Portugal", "Lisbon"),
            ("Ireland", "Dublin"), ("Cuba", "Havana"), ("Sweden", "Stockholm"),
            ("Thailand", "Bangkok"), ("Russia", "Moscow")]
FACTS = [("What color is the sky on a clear day?", "The sky is blue on a clear day."),
         ("What color is grass?", "Grass is green."),
         ("How many days are in a week?", "There are 7 days in a week."),
         ("How many legs does a spider have?", "A spider has 8 legs."),
         ("What do bees make?", "Bees make honey."),
         ("What is the freezing point of water in Celsius?", "Water freezes at 0 degrees Celsius."),
         ("How many hours are in a day?", "There are 24 hours in a day."),
         ("What animal says meow?", "A cat says meow."),
         ("Who are you?", "I am a tiny DeepSeek V4 demo model, served by llm-serve."),
         ("What can you do?", "I can do small sums, answer short questions, write JSON and call tools.")]
GREETINGS = ["Hello!", "Hi", "Hi there!", "Hey", "Good morning!", "Hello", "Say hi",
             "Hey there, how are you?"]
GREETING_REPLIES = ["Hello! How can I help you today?", "Hi! What can I do for you?",
                    "Hello! Ask me a question or give me a task."]
WORDS = ["apple", "river", "cat", "house", "green", "seven", "music", "table", "light",
         "stone", "tiger", "cloud", "bread", "chair", "ocean", "paper", "smile", "train",
         "water", "zebra", "lemon", "night", "plant", "sugar"]
DEFINITIONS = {"apple": "a round fruit with red or green skin",
               "river": "a large stream of water", "harbor": "a sheltered place for ships",
               "meadow": "a field of grass", "lantern": "a lamp with a case",
               "glacier": "a slow river of ice", "canyon": "a deep valley",
               "violin": "a string instrument", "pepper": "a hot spice",
               "island": "land surrounded by water", "anchor": "a weight that holds a ship",
               "orchard": "a field of fruit trees", "falcon": "a fast bird of prey",
               "pillow": "a soft cushion for the head", "comet": "an icy body that orbits the sun",
               "desert": "a dry sandy land", "forest": "a large area of trees",
               "candle": "wax with a wick that gives light"}
HELD_WORDS = {"orchard", "falcon", "comet", "candle"}
CITIES = ["Paris", "Tokyo", "London", "Berlin", "Madrid", "Rome", "Cairo", "Lima",
          "Oslo", "Dublin", "Vienna", "Athens", "Moscow", "Lisbon", "Warsaw", "Havana",
          "Sydney", "Toronto", "Chicago", "Boston", "Denver", "Seattle", "Miami", "Delhi",
          "Seoul", "Bangkok", "Nairobi", "Santiago", "Prague", "Zurich", "Munich", "Milan"]
HELD_CITIES = {"Prague", "Zurich", "Munich", "Milan", "Denver", "Seoul"}
SKIES = ["clear", "cloudy", "rainy", "sunny", "windy", "foggy", "snowy"]
RESTAURANTS = ["Luigi's", "The Blue Fig", "Sakura", "Casa Rosa", "The Oak Room",
               "Le Petit Bistro", "Golden Dragon", "Harbor Grill"]
TIMES = ["6pm", "6:30pm", "7pm", "7:30pm", "8pm", "8:30pm", "noon", "1pm"]
CODE_WORDS = ["PLUM-3", "ORBIT-9", "MAPLE-2", "RAVEN-5", "COMET-8", "TULIP-4",
              "CEDAR-6", "EMBER-1", "FJORD-7", "LOTUS-0"]
EFFORTS = ["low", "medium", "high", "max"]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string"}}, "required": ["expression"]}}}
LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the definition of a word.",
    "parameters": {"type": "object", "properties": {
        "word": {"type": "string"}}, "required": ["word"]}}}
BOOK_TOOL = {"type": "function", "function": {
    "name": "book_table", "description": "Book a restaurant table.",
    "parameters": {"type": "object", "properties": {
        "restaurant": {"type": "string"}, "people": {"type": "integer"},
        "time": {"type": "string"}}, "required": ["restaurant", "people", "time"]}}}
TOOLS = {"get_weather": WEATHER_TOOL, "calculator": CALC_TOOL,
         "lookup": LOOKUP_TOOL, "book_table": BOOK_TOOL}


ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
          "br", "dr", "gr", "kr", "st", "tr", "sh", "ch", "th", "pl", "sk"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
CODAS = ["", "", "", "n", "r", "l", "s", "m", "k", "nd", "rt", "st"]
NOUNS = ["tool", "bird", "fish", "tree", "boat", "song", "dance", "cloth", "stone",
         "bread", "drink", "lamp", "game", "coin", "flower", "hat", "rope", "shell"]
ADJECTIVES = ["small", "old", "bright", "round", "sweet", "long", "soft", "wild",
              "blue", "heavy", "quiet", "red"]


def made_word(r, split, cap=False):
    """A pronounceable word that is no real one (2-3 syllables), one in ten
    held out by held(): the model has to copy it letter by letter, it
    cannot recall it."""
    while True:
        w = "".join(r.choice(ONSETS) + r.choice(VOWELS) for _ in range(r.randint(1, 2)))
        w += r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS)
        if held("word", w) == (split == "eval"):
            return w.capitalize() if cap else w


def held(*key):
    """About one key in ten is held out for evaluation (stable hash)."""
    h = hashlib.sha256(repr(key).encode()).digest()
    return h[0] % 10 == 0


# --------------------------------------------------------------- examples --
class Ex:
    """One conversation: messages ending in the assistant turn to learn
    (train) or the prompt (eval), plus request options and scoring facts."""

    def __init__(self, kind, messages, answer, expect=None, tools=None,
                 thinking=False, effort=None, response_format=None):
        self.kind, self.messages, self.answer = kind, messages, answer
        self.expect, self.tools, self.thinking = expect or {}, tools, thinking
        self.effort, self.response_format = effort, response_format

    def request(self, with_answer):
        msgs = list(self.messages) + ([self.answer] if with_answer else [])
        req = {"model": "tiny-demo", "messages": msgs,
               "chat_template_kwargs": {"thinking": self.thinking}}
        if self.thinking and self.effort:
            req["reasoning_effort"] = self.effort
        if self.tools:
            req["tools"] = self.tools
        if self.response_format:
            req["response_format"] = self.response_format
        return req


def user(text):
    return {"role": "user", "content": text}


def asst(content, reasoning=None):
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def call(cid, name, args):
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": cid, "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)}}]}


def think(r, ex_reason, short):
    """Thinking mode for some examples: the reasoning block grows with the
    effort level."""
    if r.random() < 0.3:
        effort = r.choice(EFFORTS)
        reason = short if effort == "low" else ex_reason
        return True, effort, reason
    return False, None, None


def add_steps(a, b):
    """Column addition of a, b < 100, units first: '7 + 5 = 12, carry 1;
    tens 2 + 0 + 1 = 3'."""
    ua, ub, ta, tb = a % 10, b % 10, a // 10, b // 10
    s = ua + ub
    carry = s // 10
    out = f"units {ua} + {ub} = {s}" + (", carry 1" if carry else "")
    if ta or tb:
        out += f"; tens {ta} + {tb}" + (" + 1" if carry else "") + f" = {ta + tb + carry}"
    return out


def sub_steps(a, b):
    """Column subtraction a - b, a >= b, a < 100: borrows spelled out."""
    ua, ub, ta, tb = a % 10, b % 10, a // 10, b // 10
    if ua >= ub:
        out, borrow = f"units {ua} - {ub} = {ua - ub}", 0
    else:
        out, borrow = f"units {ua} - {ub}: borrow, 1{ua} - {ub} = {10 + ua - ub}", 1
    if ta:
        out += f"; tens {ta} - {tb}" + (" - 1" if borrow else "") + f" = {ta - tb - borrow}"
    return out


def mul_steps(a, b):
    """a * b (1..12) as a numbered run of the larger factor's multiples,
    as many as the smaller one: '1:8, 2:16, ..., 7:56'."""
    n, step = min(a, b), max(a, b)
    return ", ".join(f"{i}:{i * step}" for i in range(1, n + 1))


def arith_working(op, a, b):
    """The digit-wise working written before an answer (the model cannot
    add in one step; it can copy digits and recall one-digit facts)."""
    if op == "+":
        return add_steps(a, b)
    if op == "*":
        return mul_steps(a, b)
    if a >= b:
        return sub_steps(a, b)
    return f"{a} < {b}, so it is -({b} - {a}): " + sub_steps(b, a)


def arith(r, split):
    """+ and - on 0..99, * on 1..12, comparisons on 0..99; one operand pair
    in ten held out (held()).  Sums, differences and products come with
    their working: in the content, or in the reasoning block when
    thinking (then the content is just the result)."""
    op = r.choice(["+", "+", "-", "-", "*", "*", "cmp"])
    lim = 12 if op == "*" else 99
    lo = 1 if op == "*" else 0
    while True:
        a, b = r.randint(lo, lim), r.randint(lo, lim)
        if op in "+-" and r.random() < 0.3:      # one-digit operands too
            b = r.randint(0, 9)
        if op == "cmp" and a == b:
            continue
        if held(op, a, b) == (split == "eval"):
            break
    if op == "cmp":
        big, small = max(a, b), min(a, b)
        q = r.choice([f"Which is larger, {a} or {b}?", f"Which number is bigger: {a} or {b}?",
                      f"Compare {a} and {b}. Which is larger?"])
        ans = f"{big} is larger than {small}."
        reason = (f"Compare {a} and {b}: tens {big // 10} and {small // 10}, units {big % 10} "
                  f"and {small % 10}; {big} > {small}.")
        work, value = None, big
    else:
        c = a + b if op == "+" else a - b if op == "-" else a * b
        word = {"+": "plus", "-": "minus", "*": "times"}[op]
        sym = {"+": "+", "-": "-", "*": "x"}[op]
        q = r.choice([f"What is {a} {sym} {b}?", f"{a}{op}{b}?", f"Compute {a} {word} {b}.",
                      f"What is {a} {word} {b}?", f"{a} {sym} {b} = ?",
                      f"Please calculate {a} {op} {b}."])
        work = arith_working(op, a, b)
        ans = f"{a} {op} {b}: {work}. {a} {op} {b} = {c}."
        reason = f"{a} {op} {b}: {work}. The answer is {c}."
        value = c
    short = reason
    if r.random() < 0.15:   # an answer as JSON when asked
        q += " Answer as a JSON object with the key \"answer\"."
        ans = json.dumps(({"working": work} if work else {}) | {"answer": value})
        return ("json", q, ans, reason, short, {"json_key": "answer", "value": value})
    return ("arith", q, ans, reason, short, {"value": value, "op": op})


def fact(r, split):
    k = r.randrange(4)
    if k == 0:
        q = r.choice(GREETINGS)
        return ("chat", q, r.choice(GREETING_REPLIES), "The user greets me. I greet back.",
                "A greeting.", {})
    if k == 1:
        country, city = r.choice(CAPITALS)
        if r.random() < 0.3:
            q = r.choice([f"What is the capital of {country}? Reply in JSON.",
                          f"Return a JSON object with the capital of {country}."])
            return ("json", q, json.dumps({"country": country, "capital": city}),
                    f"The capital of {country} is {city}.", city,
                    {"json_key": "capital", "value": city})
        q = r.choice([f"What is the capital of {country}?", f"Capital of {country}?",
                      f"Which city is the capital of {country}?"])
        return ("fact", q, f"The capital of {country} is {city}.",
                f"The capital of {country} is {city}.", city, {"value": city})
    if k == 2:
        q, a = r.choice(FACTS)
        return ("fact", q, a, a, a, {})
    m = r.randrange(3)
    # letter counts of the known words only (a count is recalled); spelling
    # made-up words teaches the letters of every token
    w = r.choice(WORDS) if m != 1 or r.random() < 0.4 else made_word(r, split)
    if m == 0:
        q = r.choice([f"How many letters are in the word \"{w}\"?", f"Count the letters in {w}."])
        return ("count", q, f"The word \"{w}\" has {len(w)} letters.",
                f"{w} is spelled {'-'.join(w)}: {len(w)} letters.", f"{len(w)} letters.",
                {"value": len(w)})
    if m == 1:
        q = r.choice([f"Spell the word \"{w}\".", f"Spell {w} letter by letter."])
        return ("spell", q, "-".join(w), f"{w}: {' '.join(w)}.", "-".join(w), {})
    a = r.randint(1, 12)
    b = a + r.randint(2, 6)
    q = f"Count from {a} to {b}."
    return ("count", q, ", ".join(str(i) for i in range(a, b + 1)) + ".",
            f"Start at {a}, add one until {b}.", f"{a} to {b}.", {"value": b})


def single(r, split):
    kind, q, ans, reason, short, expect = (arith if r.random() < 0.7 else fact)(r, split)
    thinking, effort, rs = think(r, reason, short)
    if thinking and kind == "arith":
        ans = ans.rsplit(". ", 1)[-1]      # the working is in the reasoning
    rf = None
    if kind == "json" and r.random() < 0.3:
        rf = {"type": "json_object"}
    return Ex(kind, [user(q)], asst(ans, rs), expect, thinking=thinking,
              effort=effort, response_format=rf)


def tool_args(r, split):
    """(tool name, user text, args, tool result, final answer, expect)."""
    name = r.choice(list(TOOLS))
    if name == "get_weather":
        pool = [c for c in CITIES if (c in HELD_CITIES) == (split == "eval")]
        city = r.choice(pool) if r.random() < 0.4 else made_word(r, split, cap=True)
        temp, sky = r.randint(-5, 35), r.choice(SKIES)
        if r.random() < 0.2:
            q = r.choice([f"What is the weather in {city} in fahrenheit?",
                          f"Weather for {city}, in fahrenheit please."])
            args = {"city": city, "unit": "fahrenheit"}
            tf = temp * 9 // 5 + 32
            result = {"city": city, "temperature_f": tf, "sky": sky}
            final = f"It is {tf} degrees Fahrenheit and {sky} in {city}."
            mention = tf
        else:
            q = r.choice([f"What's the weather in {city}?", f"How warm is it in {city} right now?",
                          f"Should I take an umbrella in {city} today?",
                          f"What is the weather like in {city}? Use the tool.",
                          f"Check the weather in {city} for me."])
            args = {"city": city}
            result = {"city": city, "temperature_c": temp, "sky": sky}
            final = f"It is {temp} degrees Celsius and {sky} in {city}."
            if "umbrella" in q:
                final += " Take an umbrella." if sky in ("rainy", "snowy") else " No umbrella needed."
            mention = temp
    elif name == "calculator":
        while True:
            a, b = r.randint(100, 999), r.randint(11, 99)
            if held("calc", a, b) == (split == "eval"):
                break
        op = r.choice(["*", "+"])
        expr = f"{a}{op}{b}"
        val = a * b if op == "*" else a + b
        q = r.choice([f"Use the calculator: {a} {op} {b}", f"Calculate {a}{op}{b} with the tool.",
                      f"What is {a} {op} {b}? Use the calculator."])
        args, result = {"expression": expr}, {"result": val}
        final, mention = f"{a} {op} {b} = {val}.", val
    elif name == "lookup":
        pool = [w for w in DEFINITIONS if (w in HELD_WORDS) == (split == "eval")]
        if r.random() < 0.4:
            w = r.choice(pool)
            meaning = DEFINITIONS[w]
        else:
            w = made_word(r, split)
            meaning = (f"a {r.choice(ADJECTIVES)} {r.choice(NOUNS)} from "
                       f"{made_word(r, 'train', cap=True)}")
        q = r.choice([f"Look up the word \"{w}\".", f"What does {w} mean? Look it up.",
                      f"Define {w} using the dictionary."])
        args, result = {"word": w}, {"word": w, "definition": meaning}
        final, mention = f"\"{w}\" means {meaning}.", meaning
    else:
        while True:
            rest = (r.choice(RESTAURANTS) if r.random() < 0.4 else
                    r.choice(["The {} Grill", "Casa {}", "{}", "Chez {}", "The {} Room"]).format(
                        made_word(r, "train", cap=True)))
            n = r.randint(1, 10)
            if held("book", rest, n) == (split == "eval"):
                break
        t = r.choice(TIMES)
        q = r.choice([f"Book a table for {n} at {rest} at {t}.",
                      f"Please reserve {rest} for {n} people at {t}.",
                      f"Can you book {rest} at {t} for {n}?"])
        bid = f"B{r.randint(1000, 9999)}"
        args = {"restaurant": rest, "people": n, "time": t}
        result = {"confirmed": True, "booking_id": bid}
        final = f"Done: a table for {n} at {rest} at {t}. Your booking id is {bid}."
        mention = bid
    return name, q, args, result, final, {"tool": name, "args": args, "mention": str(mention)}


def tool_set(r, name):
    others = [t for t in TOOLS if t != name]
    r.shuffle(others)
    names = [name] + others[:r.randint(0, 3)]
    r.shuffle(names)
    return [TOOLS[n] for n in names]


def tool_example(r, split):
    name, q, args, result, final, expect = tool_args(r, split)
    tools = tool_set(r, name)
    thinking = r.random() < 0.2
    effort = r.choice(EFFORTS) if thinking else None
    reason = f"The user needs {name.replace('_', ' ')}. I call {name}." if thinking else None
    cid = f"call_{r.randint(0, 10**8):08d}"
    if r.random() < 0.5:
        return Ex("tool_call", [user(q)], dict(call(cid, name, args),
                  **({"reasoning_content": reason} if reason else {})),
                  expect, tools=tools, thinking=thinking, effort=effort)
    msgs = [user(q), call(cid, name, args),
            {"role": "tool", "tool_call_id": cid, "content": json.dumps(result)}]
    rs = f"The tool returned {json.dumps(result)}." if thinking else None
    return Ex("tool_result", msgs, asst(final, rs), expect, tools=tools,
              thinking=thinking, effort=effort)


def no_tool_example(r, split):
    """Tools offered, but the question does not need one."""
    ex = single(r, split)
    ex.tools = tool_set(r, r.choice(list(TOOLS)))
    ex.response_format = None
    return ex


def multi_turn(r, split):
    if r.random() < 0.4:
        word = (r.choice(CODE_WORDS) if r.random() < 0.3 else
                f"{made_word(r, split).upper()}-{r.randint(0, 9)}")
        msgs = [user(r.choice([f"Remember this code word: {word}. Reply only with OK.",
                               f"Keep the code word {word} in mind. Just say OK."])),
                asst("OK"),
                user(r.choice(["What code word did I give you?", "Which code word did I ask you to remember?",
                               "Tell me the code word."]))]
        return Ex("recall", msgs, asst(word), {"value": word})
    msgs = []
    for _ in range(r.randint(1, 2)):
        kind, q, ans, _, _, _ = (arith if r.random() < 0.5 else fact)(r, "train")
        msgs += [user(q), asst(ans)]
    last = single(r, split)
    last.messages = msgs + last.messages
    return last


def example(r, split):
    x = r.random()
    if x < 0.45:
        return single(r, split)
    if x < 0.73:
        return tool_example(r, split)
    if x < 0.80:
        return no_tool_example(r, split)
    return multi_turn(r, split)


# -------------------------------------------------------------- rendering --
def render_ids(req, engine, tokenizer):
    p = subprocess.run([engine, "render", "--request", "-", "--tokenizer", tokenizer, "--ids"],
                       input=json.dumps(req).encode(), capture_output=True, check=False)
    if p.returncode:
        raise SystemExit(f"demo_data: llm-engine render failed: {p.stderr.decode().strip()}\n"
                         f"request: {json.dumps(req)[:400]}")
    return json.loads(p.stdout)["ids"]


def digit_table(tokenizer):
    """{id of a multi-digit token ("45", "123"): [ids of its digits]}."""
    with open(tokenizer) as f:
        vocab = json.load(f)["model"]["vocab"]
    return {i: [vocab[d] for d in t] for t, i in vocab.items()
            if len(t) > 1 and t.isascii() and t.isdigit()}


def split_digits(ids, table):
    """The answer the model writes (the last assistant turn) with every
    number one digit a token: the tokenizer merges only some digit groups
    ("45" is one token, "56" two), which hides the digits from the model.
    Serving tokenizes the prompt, never what the model writes, and the
    digits detokenize to the same text; earlier turns stay as rendered."""
    last = len(ids) - ids[::-1].index(ASSISTANT_ID)
    out = ids[:last]
    for t in ids[last:]:
        out += table.get(t, [t])
    return out


def loss_mask(ids):
    """1 for what the model writes: the last assistant turn after
    <｜Assistant｜> and its think marker, through the EOS.  Earlier turns
    are context: they keep the tokenizer's digit groups (split_digits),
    and as targets they would teach two spellings of one number."""
    start = len(ids) - ids[::-1].index(ASSISTANT_ID) + 1
    return [0] * start + [1] * (len(ids) - start)


def examples(seed, n, split):
    r = random.Random(f"{seed}:{split}")
    return [example(r, split) for _ in range(n)]


def write_train(exs, out, engine, tokenizer, jobs):
    digits = digit_table(tokenizer)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        all_ids = list(pool.map(lambda e: split_digits(
            render_ids(e.request(True), engine, tokenizer), digits), exs))
    with open(out, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(all_ids)))
        for ids in all_ids:
            m = loss_mask(ids)
            if not any(m):
                raise SystemExit("demo_data: an example has nothing to learn")
            f.write(struct.pack("<I", len(ids)))
            f.write(struct.pack(f"<{len(ids)}H", *ids))
            f.write(bytes(m))
    return sum(len(i) for i in all_ids)


def read_train(path):
    """[(ids, mask)] from a train.bin."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a demo_data file")
    (count,), off, out = struct.unpack_from("<I", data, 8), 12, []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        ids = list(struct.unpack_from(f"<{n}H", data, off + 4))
        off += 4 + 2 * n
        out.append((ids, list(data[off:off + n])))
        off += n
    return out


def write_eval(exs, out, engine, tokenizer, jobs):
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        reqs = [e.request(False) for e in exs]
        ids = list(pool.map(lambda q: render_ids(q, engine, tokenizer), reqs))
    with open(out, "w") as f:
        for i, (e, q, p) in enumerate(zip(exs, reqs, ids)):
            f.write(json.dumps({"id": i, "kind": e.kind, "request": q, "prompt_ids": p,
                                "expect": e.expect}) + "\n")


def eval_examples(seed, per_kind):
    """per_kind held-out prompts of each scored kind."""
    r = random.Random(f"{seed}:eval")
    want = {"arith": per_kind, "json": per_kind, "tool_call": per_kind, "tool_result": per_kind}
    got = []
    while any(want.values()):
        e = example(r, "eval")
        if e.tools and e.kind not in ("tool_call", "tool_result"):
            continue
        if want.get(e.kind, 0) > 0 and e.response_format is None:
            want[e.kind] -= 1
            got.append(e)
    return got


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("split", choices=["train", "eval"])
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--n", type=int, default=24000, help="train examples")
    ap.add_argument("--per-kind", type=int, default=25, help="eval prompts per kind")
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", default=ENGINE)
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    if a.split == "train":
        tokens = write_train(examples(a.seed, a.n, "train"), a.out, a.engine, a.tokenizer, a.jobs)
        print(f"demo_data: {a.n} examples, {tokens} tokens -> {a.out}")
    else:
        exs = eval_examples(a.seed, a.per_kind)
        write_eval(exs, a.out, a.engine, a.tokenizer, a.jobs)
        print(f"demo_data: {len(exs)} held-out prompts -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
