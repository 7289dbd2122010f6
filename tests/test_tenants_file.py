"""The tenants file (``rollmux serve --tenants``): tokens' hashes and quotas, and every
mistake refused with the file and the field named."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.errors import SpecError
from rollmux.runtime.auth import Credentials, Quota, load_tenants

HEX = "a" * 64


def _load(tmp_path, text: str):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return load_tenants(path)


def test_hashes_and_quotas_are_read(tmp_path):
    got = _load(tmp_path, f"tenants:\n  team-a: {{token_sha256: {HEX}, max_live_jobs: 4, max_gpus: 128}}\n"
                          f"  team-b: {{token_sha256: {'b' * 64}}}\n"
                          f"  team-c: {{token_sha256: {'c' * 64}, max_gpus: 16}}\n")
    assert got.hashes == {"team-a": HEX, "team-b": "b" * 64, "team-c": "c" * 64}
    assert got.quotas == {"team-a": Quota(4, 128), "team-c": Quota(None, 16)}
    assert load_tenants(None).hashes == {} and load_tenants(None).quotas == {}


@pytest.mark.parametrize("entry, field", [
    (f"{{token_sha256: {HEX}, max_live_job: 4}}", "tenants.team-a.max_live_job"),  # a typo is not ignored
    (f"{{token_sha256: {HEX}, max_live_jobs: 0}}", "tenants.team-a.max_live_jobs"),
    (f"{{token_sha256: {HEX}, max_live_jobs: true}}", "tenants.team-a.max_live_jobs"),
    (f"{{token_sha256: {HEX}, max_gpus: '64'}}", "tenants.team-a.max_gpus"),
    (f"{{token_sha256: {HEX}, max_gpus: 2.5}}", "tenants.team-a.max_gpus"),
    ("{token_sha256: xyz}", "tenants.team-a.token_sha256"),
    ("abc", "tenants.team-a"),
])
def test_a_mistake_names_the_file_and_the_field(tmp_path, entry, field):
    with pytest.raises(SpecError) as err:
        _load(tmp_path, f"tenants:\n  team-a: {entry}\n")
    assert err.value.field == field and "tenants.yaml" in str(err.value)


@pytest.mark.parametrize("text, field", [
    (f"tenants:\n  team-a: {{token_sha256: {HEX}}}\nmax_live_jobs: 1\n", "max_live_jobs"),  # indented too little
    ("tenants:\n  - team-a\n", "tenants"),
    ("tenants:\n", "tenants"),
    (f"tenant:\n  team-a: {{token_sha256: {HEX}}}\n", "tenant"),
    ("- 1\n", "(top level)"),
    (f"tenants:\n  team-a: {{token_sha256: {HEX}}}\n  team-b: {{token_sha256: {HEX}}}\n",
     "tenants.team-b.token_sha256"),  # two tenants, one token: whose quota would apply?
])
def test_a_file_of_the_wrong_shape_names_what_is_wrong(tmp_path, text, field):
    with pytest.raises(SpecError) as err:
        _load(tmp_path, text)
    assert err.value.field == field, str(err.value)


def test_a_key_given_twice_is_refused(tmp_path):
    with pytest.raises(SpecError, match="given twice"):
        _load(tmp_path, f"tenants:\n  team-a: {{token_sha256: {HEX}, max_gpus: 8, max_gpus: 16}}\n")


def test_a_tenant_with_the_admin_token_is_refused():
    with pytest.raises(SpecError) as err:
        Credentials(HEX, {"team-a": "b" * 64, "team-b": HEX})
    assert err.value.field == "tenants.team-b.token_sha256" and HEX not in str(err.value)


@pytest.mark.parametrize("name", ["team-q", "010", "1.5", "yes", "null", "true", "0x1F"])
def test_the_entry_printed_for_a_new_tenant_loads_with_its_quota(tmp_path, name):
    """Whatever the name, the printed entry loads as that name (it is quoted: unquoted,
    010 read as a number and null as nothing, and the service refused its own entry)."""
    out = CliRunner().invoke(app, ["admin", "tenant-token", name, "--max-live-jobs", "3", "--max-gpus", "64"])
    assert out.exit_code == 0, out.output
    token = out.output.split("token: ")[1].split()[0]
    entry = out.output.split("tenants file entry:\n")[1]
    got = _load(tmp_path, "tenants:\n" + entry)
    assert got.quotas == {name: Quota(3, 64)}
    assert Credentials(HEX, got.hashes).submitter(token) == name


@pytest.mark.parametrize("value,shown", [("010", None), ("0x10", "'0x10'"), ("1_0", "'1_0'")])
def test_a_quota_is_a_plain_decimal_integer(tmp_path, value, shown):
    """``010`` is ten (YAML 1.1 read it as octal 8: a quota of 8 where 10 was written);
    hex and underscores are not numbers here, and are refused naming the field."""
    text = f"tenants:\n  team-a: {{token_sha256: {HEX}, max_live_jobs: {value}}}\n"
    if shown is None:
        assert _load(tmp_path, text).quotas == {"team-a": Quota(10, None)}
        return
    with pytest.raises(SpecError) as err:
        _load(tmp_path, text)
    assert err.value.field == "tenants.team-a.max_live_jobs" and shown in str(err.value)


@pytest.mark.parametrize("text,needle", [
    ("a: &x [1, 2]\nb: *x\n", "aliases are not accepted"),
    ("tenants:\n  team-a: {token_sha256: " + "f" * 64 + "}\n" + "\xff".encode("latin-1").decode("latin-1") + "\n",
     "not UTF-8 text"),
])
def test_aliases_and_bytes_that_are_not_utf8_are_refused_naming_the_file(tmp_path, text, needle):
    path = tmp_path / "tenants.yaml"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(SpecError) as err:
        load_tenants(path)
    assert needle in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("where, needle", [("missing/x.db", "does not exist"), ("a-file/x.db", "is not a folder"),
                                           ("a-dir", "a directory"), ("notes.txt", "not an SQLite database"),
                                           ("a-file", "empty (0 bytes)")])
def test_serve_refuses_a_state_path_that_cannot_be_one_before_writing_anything(tmp_path, where, needle):
    """Exit 2 naming ``--state`` (it said ``[Errno 2] ... x.db.admin-token``; a text file
    was refused only after its admin token file and lock were written beside it), and
    nothing written: no admin token file or lock, the file as it was."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "notes.txt").write_text("not a state file\n")
    (tmp_path / "a-dir").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = CliRunner().invoke(app, ["serve", "--state", str(tmp_path / where), "--port", "1"],
                             env={"ROLLMUX_ADMIN_TOKEN": ""})
    assert out.exit_code == 2 and "--state" in out.output and needle in " ".join(out.output.split()), out.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "notes.txt").read_text() == "not a state file\n"


@pytest.mark.parametrize("option", ["--lease-s", "--grace-s", "--migration-s", "--move-timeout-s"])
@pytest.mark.parametrize("value", ["inf", "1e9"])
def test_serve_refuses_an_endless_duration_before_writing_anything(tmp_path, option, value):
    """``--lease-s inf`` started a service whose jobs never lost their nodes; every duration
    of serve is at most a day, refused naming the option before the state is touched."""
    out = CliRunner().invoke(app, ["serve", "--state", str(tmp_path / "x.db"), "--port", "1", option, value],
                             env={"ROLLMUX_ADMIN_TOKEN": ""})
    assert out.exit_code == 2 and option in out.output and "86400" in out.output, out.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, needle", [
    ("t\u00f6ken\n".encode("utf-8"), "not a token"), (b"\xff\xfe\n", "--token-file"),
    (b"abc\ndef\n", "not a token"),
])
def test_a_token_file_that_holds_no_token_is_refused_without_showing_it(tmp_path, content, needle):
    """(a non-ASCII token was a UnicodeEncodeError traceback, a non-UTF-8 file a
    UnicodeDecodeError; two lines were retried and then printed in the error)"""
    path = tmp_path / "token"
    path.write_bytes(content)
    out = CliRunner().invoke(app, ["status", "--url", "http://127.0.0.1:1", "--token-file", str(path)],
                             env={"ROLLMUX_ADMIN_TOKEN": "", "ROLLMUX_TOKEN": ""})
    assert out.exit_code == 2 and needle in out.output and "def" not in out.output, out.output


@pytest.mark.parametrize("url", ["ftp://x", "127.0.0.1:8470", ""])
def test_a_url_without_its_scheme_is_refused_naming_the_option(url):
    out = CliRunner().invoke(app, ["status", "--url", url], env={"ROLLMUX_ADMIN_TOKEN": "x"})
    assert out.exit_code == 2 and "--url" in out.output and "expected http://HOST:PORT" in " ".join(out.output.split())


def test_a_tenant_name_with_a_trailing_newline_is_refused(tmp_path):
    """(re.match's $ took "ok\\n", and the tenants line printed was broken YAML)"""
    out = CliRunner().invoke(app, ["admin", "tenant-token", "ok\n"])
    assert out.exit_code == 2
    path = tmp_path / "t.yaml"
    path.write_text('tenants:\n  "ok\\n": {token_sha256: ' + "f" * 64 + "}\n")
    with pytest.raises(SpecError):
        load_tenants(path)


def test_an_admin_token_file_that_is_a_folder_is_refused_naming_the_option(tmp_path, monkeypatch):
    """(``serve --admin-token-file DIR`` printed a bare ``[Errno 21] Is a directory``)"""
    from rollmux.runtime.auth import ADMIN_TOKEN_ENV, admin_token

    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    with pytest.raises(SpecError, match="--admin-token-file.*not a folder"):
        admin_token(tmp_path, tmp_path / "state.db")
    assert list(tmp_path.iterdir()) == []


def test_a_tenant_removed_from_the_file_while_its_jobs_live_is_named_on_start(tmp_path):
    """(the service started without a word, and the jobs vanished from the tenants table)"""
    from rollmux.model import Cluster, Job
    from rollmux.runtime.service import Service, ServiceConfig
    from rollmux.runtime.store import hash_token

    path = str(tmp_path / "state.db")
    config = ServiceConfig(tenants={"team-a": hash_token("a" * 40), "team-b": hash_token("b" * 40)})
    service = Service(Cluster(), path, "admin-secret", config)
    for i, tenant in enumerate(("team-a", "team-b", "team-b", "admin")):
        service.control.submit(Job(f"j{i}", 10.0, 10.0, iterations=3), 0.0, "0" * 64, None, tenant)
    service.store.commit(service.control.take_changes())
    assert service.unlisted_tenants() == {}
    service.close()
    fewer = ServiceConfig(tenants={"team-a": hash_token("a" * 40)})
    again = Service(Cluster(), path, "admin-secret", fewer)
    assert again.unlisted_tenants() == {"team-b": 2}
    assert [r.job_id for r in again.control.list_jobs(tenant="team-b")] == ["j1", "j2"]
    again.close()
