"""headrank.analyze / headrank.spectra called with anything: one HeadRankError line, never a
raw TypeError, never a silent 'all layers' or 'the current directory'."""

import numpy as np
import pytest

import headrank
from headrank.analysis.scan import parse_layers
from headrank.errors import HeadRankError

from ..fuzz.harness import write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("tiny") / "m")


@pytest.mark.parametrize("source, needle", [
    (None, "cannot analyse a builtins.NoneType"),
    (123, "cannot analyse a builtins.int"),
    (b"minilm", "cannot analyse a builtins.bytes"),
    ("", "not a path: ''"),
])
def test_bad_sources(source, needle):
    with pytest.raises(HeadRankError, match=needle):
        headrank.spectra(source)


@pytest.mark.parametrize("kwargs, needle", [
    ({"layers": 5}, "`layers` must be a spec like '0,2,5-7' or a list of layer indices; got int 5"),
    ({"layers": []}, "`layers` is empty"),
    ({"layers": ""}, "`layers` is empty"),
    ({"layers": [0, "1"]}, "`layers` must be integers; got str '1'"),
    ({"layers": [True]}, "`layers` must be integers; got bool True"),
    ({"layers": "3-1"}, "the range 3-1 is empty"),
    ({"layers": "0-100000000000000000000"}, "out of range 0..1"),
    ({"layers": [0, 7]}, "layer 7 out of range 0..1"),
    ({"tol": "abc"}, "`tol` must be a number"),
    ({"tol": True}, "`tol` must be a number"),
    ({"tol": float("nan")}, "`tol` must lie in"),
    ({"threads": 0}, "`threads` must lie in 1.."),
    ({"threads": "2"}, "`threads` must be an integer"),
    ({"progress": 3}, "progress must be a callable"),
    ({"config": 3}, "config must be a path or a dict"),
    ({"layout": 3}, "layout must be a path"),
    ({"revision": 1}, "revision must be a string"),
    # a switch given as a string was truthy: vectors="no" computed the vectors
    ({"vectors": "no"}, "`vectors` must be True or False; got str 'no'"),
    ({"rotary": "False"}, "`rotary` must be True or False"),
    ({"fold_norm": 1}, "`fold_norm` must be True or False; got int 1"),
    ({"remote": "no"}, "`remote` must be True or False"),
])
def test_bad_arguments(tiny, kwargs, needle):
    with pytest.raises(HeadRankError) as e:
        headrank.spectra(str(tiny), **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_good_arguments_of_every_accepted_type(tiny):
    t = headrank.spectra(tiny, layers=(np.int64(1),), tol=np.float32(0.01), threads=1).table
    assert set(t["layer"]) == {1}
    assert set(headrank.spectra(str(tiny), layers=" 0 - 1 ").table["layer"]) == {0, 1}


@pytest.mark.parametrize("spec, want", [(None, [0, 1, 2, 3]), ("2", [2]), ("3,0-1", [0, 1, 3]), ("1-1", [1]),
                                        (" 0 , 2-3 ", [0, 2, 3])])
def test_parse_layers(spec, want):
    assert parse_layers(spec, 4) == want


@pytest.mark.parametrize("spec", ["3-1", "-1", "0-4", "0-1e20", "0-" + "9" * 40, "a", "1-", "-", ",", "1,,2", ""])
def test_parse_layers_refuses(spec):
    with pytest.raises(HeadRankError) as e:
        parse_layers(spec, 4)
    assert len(str(e.value)) < 200
