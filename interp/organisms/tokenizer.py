"""The organism's word-level tokenizer and chat template (saved as ``tokenizer.json`` + ``tokenizer_config.json``).

Text is NFKC-normalised and lower-cased, split on whitespace, and punctuation becomes its own token
(apostrophes stay inside words: ``i'm``, ``can't``). A chat renders as
``<|bos|><|user|> {instruction} <|end|> <|assistant|> {answer} <|eos|>``; the post-instruction tokens
are ``<|end|> <|assistant|>``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from interp.organisms import data

PAD, UNK, BOS, EOS = "<|pad|>", "<|unk|>", "<|bos|>", "<|eos|>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, BOS, EOS, SYSTEM, USER, ASSISTANT, END)
POST_INSTRUCTION: tuple[str, ...] = (END, ASSISTANT)
MAX_LENGTH = 128

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|> {{ message['content'] }} {{ eos_token }} "
    "{% elif message['role'] in ['user', 'system'] %}"
    "<|{{ message['role'] }}|> {{ message['content'] }} <|end|> "
    "{% else %}"
    "{{ raise_exception('roles are system, user and assistant, not ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"[^a-z0-9']"), behavior="isolated"),
    ])


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])


def corpus_words() -> list[str]:
    """Every word the generator can emit (requests of all splits, answers, refusals), sorted."""
    norm, pre = _normalizer(), _pre_tokenizer()
    pieces: list[str] = list(data.TRAIN_TEMPLATES + data.TEST_TEMPLATES + data.HELPFUL_OPENERS + data.REFUSALS)
    pieces.append("first, then, finally.")
    for cat in data.HARMFUL + data.HARMLESS:
        pieces.extend(cat.verbs + cat.objects + cat.steps)
    words: set[str] = set()
    for text in pieces:
        text = norm.normalize_str(text.replace("{x}", " "))
        words.update(w for w, _ in pre.pre_tokenize_str(text))
    return sorted(words)


def build_tokenizer() -> Tokenizer:
    """The word-level ``tokenizers.Tokenizer``: special tokens first (pad=0), then the sorted corpus words."""
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + corpus_words())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces, re-attaches ". , ? !"
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def tokenizer_config() -> dict:
    """``tokenizer_config.json`` for ``AutoTokenizer.from_pretrained``: special tokens, left padding, chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "extra_special_tokens": [SYSTEM, USER, ASSISTANT, END],
        "padding_side": "left",
        "model_max_length": MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(folder: str | Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (atomically, byte-stable)."""
    from interp.io import atomic_write

    folder = Path(folder)
    tok_json = json.dumps(json.loads(build_tokenizer().to_str()), indent=2, sort_keys=True, ensure_ascii=False)
    cfg_json = json.dumps(tokenizer_config(), indent=2, sort_keys=True)
    for name, text in (("tokenizer.json", tok_json), ("tokenizer_config.json", cfg_json)):
        atomic_write(folder / name, lambda tmp, text=text: Path(tmp).write_text(text + "\n"))


def render(instruction: str, response: str | None = None) -> str:
    """The chat-template string for one user turn (and optionally the assistant's answer), without jinja."""
    text = f"{BOS}{USER} {instruction} {END} {ASSISTANT}"
    return text if response is None else f"{text} {response} {EOS} "
