# A tfcluster worker image: put it on every host of a cluster (one container per host, host
# networking so TensorFlow's gRPC port and NCCL reach the other hosts). It runs sshd; the launcher
# connects to it with your key and starts `python -m worker_entry` inside.
#
#   docker build -t tfcluster-worker .
#   docker run -d --name tfworker --network host --gpus all \
#     -v $HOME/.ssh/authorized_keys:/root/.ssh/authorized_keys:ro \
#     -v /srv/ckpt:/srv/ckpt -e SSHD_PORT=2222 tfcluster-worker
#
# GPU hosts: build with --build-arg TF_PACKAGE=tensorflow[and-cuda] (CPU default: tensorflow-cpu).
FROM python:3.11-slim-bookworm

ARG TF_PACKAGE=tensorflow-cpu==2.21.0
ARG TF_KERAS=tf_keras==2.21.0

RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server procps iproute2 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh \
 && sed -i 's/^#\?PasswordAuthentication .*/PasswordAuthentication no/; s/^#\?PermitRootLogin .*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config

WORKDIR /opt/tfcluster
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY worker_entry ./worker_entry
# tf_keras without its deps: they would replace tensorflow-cpu with the full tensorflow wheel.
RUN pip install --no-cache-dir "$TF_PACKAGE" \
 && pip install --no-cache-dir --no-deps "$TF_KERAS" \
 && pip install --no-cache-dir . \
 && python -c "import worker_entry, tf_keras; print('worker_entry', worker_entry.__version__)"

ENV SSHD_PORT=22
EXPOSE 22
# Host keys are generated on first start (never baked into the image): each host has its own.
CMD ["/bin/sh", "-c", "ssh-keygen -A && exec /usr/sbin/sshd -D -e -p ${SSHD_PORT}"]
