"""Writes categories.jsonl: 8 categories x 12 items, each with a superordinate and a typicality rating 1-7.

The ratings are OUR OWN judgements, written by hand for this toolkit (not human norms such as Rosch 1975): 7 = a very
typical member, 1 = a marginal one. Run ``python interp/studies/directions/data/similarity/make_categories.py`` to rewrite
the file (deterministic: the table below, in order)."""

import json
from pathlib import Path

SUPER = {"bird": "animal", "mammal": "animal", "fish": "animal", "insect": "animal",
         "fruit": "plant food", "vegetable": "plant food", "vehicle": "artefact", "tool": "artefact"}
TABLE = {
    "bird": "robin 7, sparrow 7, crow 6, eagle 6, pigeon 6, parrot 5, owl 5, duck 4, swan 4, chicken 3, ostrich 2, penguin 1",
    "mammal": "dog 7, cat 7, horse 7, cow 6, lion 6, deer 6, rabbit 5, mouse 5, elephant 5, monkey 4, whale 2, bat 2",
    "fish": "salmon 7, trout 7, cod 6, tuna 6, goldfish 5, carp 5, shark 4, catfish 4, swordfish 4, eel 3, seahorse 2, "
            "stingray 2",
    "insect": "ant 7, bee 7, fly 7, beetle 6, mosquito 6, wasp 6, grasshopper 5, butterfly 5, cockroach 4, ladybug 4, "
              "termite 3, flea 2",
    "fruit": "apple 7, orange 7, banana 7, pear 6, peach 6, grape 6, cherry 5, strawberry 5, lemon 4, watermelon 4, "
             "coconut 2, olive 1",
    "vegetable": "carrot 7, potato 7, broccoli 7, cabbage 6, lettuce 6, spinach 6, onion 5, celery 5, cucumber 4, "
                 "pumpkin 3, garlic 3, mushroom 1",
    "vehicle": "car 7, bus 7, truck 7, van 6, motorcycle 6, taxi 6, train 5, bicycle 5, tractor 4, boat 3, airplane 3, "
               "skateboard 1",
    "tool": "hammer 7, screwdriver 7, wrench 7, saw 6, pliers 6, drill 6, chisel 5, shovel 5, axe 5, knife 3, ladder 2, "
            "broom 2",
}


def rows() -> list[dict]:
    out = []
    for cat, spec in TABLE.items():
        for entry in spec.split(", "):
            item, rating = entry.rsplit(" ", 1)
            out.append({"item": item, "category": cat, "superordinate": SUPER[cat], "typicality": int(rating)})
    return out


if __name__ == "__main__":
    meta = {"_meta": "typicality 1-7 are our own ratings written for interp-toolkit, not human norms"}
    lines = [json.dumps(meta)] + [json.dumps(r) for r in rows()]
    target = Path(__file__).with_name("categories.jsonl")
    tmp = target.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(target)
