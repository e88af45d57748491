# syntax=docker/dockerfile:1
# `mla-export serve` in a container: an OpenAI-compatible server for an export directory.
#
#   docker build -t mla-export .
#   docker run --rm -p 8000:8000 -v /path/to/export:/model:ro mla-export
#   docker run --rm -p 8000:8000 -v /path/to/export:/model:ro mla-export /model --max-num-seqs 8
#
# The arguments after the image name replace "/model" (CMD) and go to `mla-export serve`, after
# --host 0.0.0.0 --port 8000. Both stages run the scripts tests/test_wheel_install.py runs: the
# build stage tools/build_wheel.sh, the runtime stage tools/install_wheel.sh (the test runs it
# with no compiler on PATH; this stage has none).

# ---- build: the wheel (a C++ compiler here only; CMake and Ninja come from PyPI) ----
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN bash tools/build_wheel.sh /dist

# ---- runtime: the wheel and its dependencies, no compiler ----
FROM python:3.11-slim-bookworm
COPY --from=build /dist/ /tmp/dist/
COPY tools/install_wheel.sh /tmp/tools/install_wheel.sh
RUN bash /tmp/tools/install_wheel.sh /opt/mla-export /tmp/dist/mla_export-*.whl \
 && rm -rf /tmp/dist /tmp/tools /root/.cache/pip \
 && useradd --create-home --uid 1000 mla
ENV PATH=/opt/mla-export/bin:$PATH
USER mla
EXPOSE 8000
ENTRYPOINT ["mla-export", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["/model"]
