"""Jinja chat templates for models whose checkpoints may lack one, written from the published formats.

* `LLAMA2_CHAT_TEMPLATE`: Meta's Llama-2-chat layout, `<s>[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{user}
  [/INST] {assistant} </s><s>[INST] {user} [/INST] ...`, the system block only inside the first user turn.
  (For ETO's exact FastChat "llama-2" rendering use `chat_format.Llama2ChatFormat`, which needs no Jinja.)
* `CHATML_TEMPLATE`: the ChatML layout of Qwen2/Qwen2.5 (and SmolLM2): `<|im_start|>{role}\\n{content}
  <|im_end|>\\n` per message, a default system message when none is given, and `<|im_start|>assistant\\n` as
  the generation prompt.
"""

LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system_message = messages[0]['content'] %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set system_message = none %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if message['role'] == 'user' %}"
    "{% if loop.first and system_message is not none %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] | trim + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

CHATML_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + CHATML_DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
