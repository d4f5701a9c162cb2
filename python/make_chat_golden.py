#!/usr/bin/env python3
"""Golden renderings of chat templates, from the Jinja2 engine (as transformers' apply_chat_template runs them).

Regenerate:
    .venv/bin/python python/make_chat_golden.py [--model ~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes tests/data/tokenizer/chat_templates/<name>.jinja (the template sources: SmolLM2's is read from the default
model's tokenizer.chat_template; the others are the published templates of Llama 3, Llama 2, Mistral v0.1 instruct,
Gemma, Phi-3 and Qwen2, as found in their tokenizer_config.json) and tests/data/tokenizer/chat_golden.json: for
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

# Family each template must be detected as; BOS / EOS texts of those models.
FAMILY = {"smollm2": "chatml", "qwen2": "chatml", "llama3": "llama3", "llama2": "llama2", "mistral": "mistral",
          "gemma": "gemma", "phi3": "phi3"}
SPECIAL = {"smollm2": ("<|im_start|>", "<|im_end|>"), "qwen2": ("", "<|im_end|>"),
           "llama3": ("<|begin_of_text|>", "<|eot_id|>"), "llama2": ("<s>", "</s>"), "mistral": ("<s>", "</s>"),
           "gemma": ("<bos>", "<eos>"), "phi3": ("<s>", "<|endoftext|>")}

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
    args = ap.parse_args()
    import gguf
    r = gguf.GGUFReader(args.model)
    f = r.fields["tokenizer.chat_template"]
    templates = dict(TEMPLATES, smollm2=bytes(f.parts[f.data[0]]).decode("utf-8"))

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
