"""config.json's fields read one by one: a bad value refused in one line naming the file, the field, what was expected."""
import json
import math

from cli import fail
from .ourfile import f32, number


def refuse_value(path, field, value, why):
    fail(f"{path}: {field} = {json.dumps(value)[:80]}: {why}")


def refuse(hc, path, field, why):
    refuse_value(path, field, hc.get(field), why)


def int_field(hc, path, field, default, lo=1, hi=2**31 - 1, why=""):
    """config.json's integer field (default when absent), lo..hi (our header holds int32): every integer
    field is read through this"""
    v = hc.get(field, default)
    if type(v) is not int or not lo <= v <= hi:
        refuse(hc, path, field, f"expected an integer in {lo}..{hi}{why}")
    return v


VOCAB = " (our model file's bound: Vp, the vocabulary padded to a multiple of 128, at most 2^20)"


def float_field(hc, path, field, default):
    """config.json's number field (default when absent), finite and positive also in float32 (our header
    holds float32, the precision transformers computes with it): every float field is read through this"""
    v = number(hc.get(field, default))
    if v is None or not (v > 0 and math.isfinite(f32(v)) and f32(v) > 0):
        refuse(hc, path, field, "expected a finite positive number (float32)")
    return f32(v)


def bool_field(hc, path, field, default):
    v = hc.get(field, default)
    if type(v) is not bool:
        refuse(hc, path, field, "expected true or false")
    return v
