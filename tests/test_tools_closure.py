"""tools.closure: which files of a chapter's tree a test file can run."""

from tools.closure import closure, fixtures_seen, imported_modules

TREE = {
    "tests/conftest.py": "import minisgl.utils\n\ndef fixture():\n    import minisgl.engine\n",
    "tests/test_core.py": "from minisgl.core import Req\n",
    "tests/test_kernel.py": "from minisgl import kernel\n",
    "minisgl/__init__.py": "",
    "minisgl/utils.py": "",
    "minisgl/core.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from minisgl.engine import Engine\n"
        "def make():\n"
        "    from .sampler import Sampler\n"
    ),
    "minisgl/sampler.py": "",
    "minisgl/engine.py": "",
    "minisgl/kernel/__init__.py": (
        "from minisgl.utils import Registry\nKERNELS = Registry('kernel', package=__name__)\n"
    ),
    "minisgl/kernel/triton.py": "from ..sampler import x\n",
    "minisgl/kernel/deep/__init__.py": "",
}


def test_imports_resolve_relative_forms_and_skip_type_checking():
    assert imported_modules("minisgl/core.py", TREE["minisgl/core.py"]) == {
        "minisgl.sampler",
        "minisgl.sampler.Sampler",
    }
    found = imported_modules("minisgl/kernel/triton.py", TREE["minisgl/kernel/triton.py"])
    assert found == {"minisgl.sampler", "minisgl.sampler.x"}
    conftest = TREE["tests/conftest.py"]
    assert imported_modules("tests/conftest.py", conftest, top_level_only=True) == {"minisgl.utils"}


def test_closure_follows_imports_inside_functions_and_parent_packages():
    reached = closure("tests/test_core.py", TREE)
    assert reached == {
        "tests/test_core.py",
        "tests/conftest.py",  # in every closure, with its module-level imports only
        "minisgl/__init__.py",
        "minisgl/utils.py",
        "minisgl/core.py",
        "minisgl/sampler.py",  # imported inside make()
    }
    assert "minisgl/engine.py" not in reached  # TYPE_CHECKING and a fixture's own import


def test_a_package_that_discovers_its_modules_imports_them_all():
    reached = closure("tests/test_kernel.py", TREE)
    assert {"minisgl/kernel/triton.py", "minisgl/kernel/deep/__init__.py"} <= reached
    assert "minisgl/sampler.py" in reached  # through the discovered module's own import


def test_a_module_run_as_a_process_is_in_the_closure():
    text = 'import subprocess\nsubprocess.run([sys.executable, "-m", "minisgl", "--port", "1"])\n'
    assert imported_modules("tests/test_server.py", text) == {"minisgl", "minisgl.__main__"}


CONFTEST = """\
import pytest


@pytest.fixture(autouse=True)
def seed():
    pass


@pytest.fixture
def model_path():
    return 1


@pytest.fixture
def server(model_path):  # a later chapter's fixture
    return model_path
"""


def test_a_test_file_sees_only_the_fixtures_it_can_use():
    plain = fixtures_seen(CONFTEST, "def test_a(tmp_path):\n    pass\n")
    assert "def seed" in plain and "model_path" not in plain and "server" not in plain
    served = fixtures_seen(CONFTEST, "def test_b(server):\n    pass\n")
    assert "def server" in served and "def model_path" in served  # through server's argument
    without = CONFTEST[: CONFTEST.index("\n\n@pytest.fixture\ndef server")] + "\n"
    assert fixtures_seen(without, "def test_a(tmp_path):\n    pass\n") == plain
