#!/usr/bin/env python3
"""Golden renderings of chat templates, from the Jinja2 engine (as transformers' apply_chat_template runs them).

Regenerate:
    .venv/bin/python python/make_chat_golden.py [--model ~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes tests/data/tokenizer/chat_templates/<name>.jinja (the template sources: SmolLM2's is read from the default
model's tokenizer.chat_template; the others are the published templates of Llama 3, Llama 2, Mistral v0.1 and v0.3
instruct, Gemma, Gemma 3, Phi-3 and Qwen2, as found in their tokenizer_config.json, and the ones llama.cpp keeps in
its source under models/templates (Qwen2.5, Qwen3, Phi-3.5, Mistral Nemo, Gemma 2; --llamacpp-src, the folder
scripts/build_llamacpp.sh --source prints)) and tests/data/tokenizer/chat_golden.json: for
each template and conversation, the Jinja2 output with the BOS text the template writes at the very start removed
(the tokenizer adds BOS itself), or "raises" when the template rejects the conversation (e.g. a system turn for Gemma).
"""
import argparse
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")

TEMPLATES = {
    # google/gemma-3-4b-it (the Gemma 3 instruct models share it): the system text, untrimmed, opens the first turn.
    'gemma3': (
        "{{ bos_token }}\n"
        "{%- if messages[0]['role'] == 'system' -%}\n"
        "    {%- if messages[0]['content'] is string -%}\n"
        "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
        "    {%- else -%}\n"
        "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
        "    {%- endif -%}\n"
        "    {%- set loop_messages = messages[1:] -%}\n"
        "{%- else -%}\n"
        "    {%- set first_user_prefix = \"\" -%}\n"
        "    {%- set loop_messages = messages -%}\n"
        "{%- endif -%}\n"
        "{%- for message in loop_messages -%}\n"
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
        "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
        "    {%- endif -%}\n"
        "    {%- if (message['role'] == 'assistant') -%}\n"
        "        {%- set role = \"model\" -%}\n"
        "    {%- else -%}\n"
        "        {%- set role = message['role'] -%}\n"
        "    {%- endif -%}\n"
        "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
        "    {%- if message['content'] is string -%}\n"
        "        {{ message['content'] | trim }}\n"
        "    {%- elif message['content'] is iterable -%}\n"
        "        {%- for item in message['content'] -%}\n"
        "            {%- if item['type'] == 'image' -%}\n"
        "                {{ '<start_of_image>' }}\n"
        "            {%- elif item['type'] == 'text' -%}\n"
        "                {{ item['text'] | trim }}\n"
        "            {%- endif -%}\n"
        "        {%- endfor -%}\n"
        "    {%- else -%}\n"
        "        {{ raise_exception(\"Invalid content type\") }}\n"
        "    {%- endif -%}\n"
        "    {{ '<end_of_turn>\\n' }}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "    {{'<start_of_turn>model\\n'}}\n"
        "{%- endif -%}\n"
    ),
    # mistralai/Mistral-7B-Instruct-v0.3: "[INST] " ... "[/INST]", the system text in the last user turn, replies
    # trimmed after one space.
    'mistral-v3': (
        '{%- if messages[0]["role"] == "system" %}\n    {%- set system_message = messages[0]["content"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n\n{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message["role"] == "user" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- "[AVAILABLE_TOOLS] [" }}\n            {%- for tool in tools %}\n                {%- set tool = tool.function %}\n                {{- \'{"type": "function", "function": {\' }}\n                {%- for key, val in tool.items() if key != "return" %}\n                    {%- if val is string %}\n                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n                    {%- else %}\n                        {{- \'"\' + key + \'": \' + val|tojson }}\n                    {%- endif %}\n                    {%- if not loop.last %}\n                        {{- ", " }}\n                    {%- endif %}\n                {%- endfor %}\n                {{- "}}" }}\n                {%- if not loop.last %}\n                    {{- ", " }}\n                {%- else %}\n                    {{- "]" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- "[/AVAILABLE_TOOLS]" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n        {%- else %}\n            {{- "[INST] " + message["content"] + "[/INST]" }}\n        {%- endif %}\n    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n        {{- "[TOOL_CALLS] [" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n            {%- endif %}\n            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n            {%- if not loop.last %}\n                {{- ", " }}\n            {%- else %}\n                {{- "]" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    {%- elif message["role"] == "assistant" %}\n        {{- " " + message["content"]|trim + eos_token}}\n    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n        {%- if message.content is defined and message.content.content is defined %}\n            {%- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%- endif %}\n        {{- \'[TOOL_RESULTS] {"content": \' + content|string + ", " }}\n        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n        {%- endif %}\n        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n    {%- else %}\n        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}\n    {%- endif %}\n{%- endfor %}\n'
    ),
    'gemma': (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
    ),
    'llama2': (
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
    ),
    'llama3': (
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    'mistral': (
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
    ),
    'phi3': (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
    ),
    'qwen2': (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}

# Templates read from llama.cpp's source (models/templates), by our name.
LLAMACPP_TEMPLATES = {"qwen2.5": "Qwen-Qwen2.5-7B-Instruct.jinja", "qwen3": "Qwen-Qwen3-0.6B.jinja",
                      "phi3.5": "microsoft-Phi-3.5-mini-instruct.jinja",
                      "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                      "gemma2": "google-gemma-2-2b-it.jinja"}

# Family each template must be detected as; BOS / EOS texts of those models.
FAMILY = {"smollm2": "chatml", "qwen2": "chatml", "qwen2.5": "chatml", "qwen3": "chatml", "llama3": "llama3",
          "llama2": "llama2", "mistral": "mistral", "mistral-v3": "mistral-v3", "mistral-nemo": "mistral-v3-tekken",
          "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "phi3": "phi3", "phi3.5": "phi3"}
SPECIAL = {"smollm2": ("<|im_start|>", "<|im_end|>"), "qwen2": ("", "<|im_end|>"), "qwen2.5": ("", "<|im_end|>"),
           "qwen3": ("", "<|im_end|>"), "llama3": ("<|begin_of_text|>", "<|eot_id|>"), "llama2": ("<s>", "</s>"),
           "mistral": ("<s>", "</s>"), "mistral-v3": ("<s>", "</s>"), "mistral-nemo": ("<s>", "</s>"),
           "gemma": ("<bos>", "<eos>"), "gemma2": ("<bos>", "<eos>"), "gemma3": ("<bos>", "<eos>"),
           "phi3": ("<s>", "<|endoftext|>"), "phi3.5": ("<s>", "<|endoftext|>")}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nMake it short."}],
    [{"role": "system", "content": "Sys\nprompt"}, {"role": "user", "content": "  padded  "},
     {"role": "assistant", "content": " answer\n"}, {"role": "user", "content": "Ünïcödé 😀 中文"}],
    [{"role": "user", "content": "code:\n```py\nprint('x')\n```\n"}],
    [{"role": "user", "content": ""}],
    [],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "One"},
     {"role": "assistant", "content": "Two"}, {"role": "user", "content": " Three "}],
    [{"role": "system", "content": "Only a system prompt."}],
]


def render(source, messages, add_generation_prompt, bos, eos):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    out = env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos, eos_token=eos)
    if bos and "bos_token" in source and out.startswith(bos):  # the BOS the template itself writes first
        out = out[len(bos):]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llamacpp-src", default=os.path.expanduser("~/.cache/tessera/llama.cpp-0.3.36/src"))
    args = ap.parse_args()
    import gguf
    r = gguf.GGUFReader(args.model)
    f = r.fields["tokenizer.chat_template"]
    templates = dict(TEMPLATES, smollm2=bytes(f.parts[f.data[0]]).decode("utf-8"))
    for name, file in LLAMACPP_TEMPLATES.items():
        with open(os.path.join(args.llamacpp_src, "models", "templates", file), encoding="utf-8") as fh:
            templates[name] = fh.read()

    os.makedirs(os.path.join(DATA, "chat_templates"), exist_ok=True)
    cases = []
    for name in sorted(templates):
        src = templates[name]
        with open(os.path.join(DATA, "chat_templates", name + ".jinja"), "w", encoding="utf-8") as fh:
            fh.write(src)
        bos, eos = SPECIAL[name]
        for ci, conv in enumerate(CONVERSATIONS):
            for gen in (True, False):
                case = {"template": name, "family": FAMILY[name], "bos": bos, "eos": eos, "conversation": ci,
                        "add_generation_prompt": gen}
                try:
                    case["expected"] = render(src, conv, gen, bos, eos)
                except (jinja2.exceptions.TemplateError, IndexError, jinja2.exceptions.UndefinedError):
                    case["raises"] = True
                cases.append(case)
    with open(os.path.join(DATA, "chat_golden.json"), "w", encoding="utf-8") as fh:
        json.dump({"source": f"jinja2 {jinja2.__version__}", "regenerate": "python/make_chat_golden.py",
                   "conversations": CONVERSATIONS, "cases": cases}, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(f"make_chat_golden: {len(cases)} cases", flush=True)


if __name__ == "__main__":
    main()
