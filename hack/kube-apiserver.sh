#!/usr/bin/env bash
# kube-apiserver.sh - run a REAL kube-apiserver + etcd on loopback for integration tests
# (the project's copy of the proven recipe; testkit/kubetest drives it from TestMain).
#
# No kubelet; controllers only on request (see --with-controller-manager); the
# scheduler is only built here (--with-scheduler): tests start it themselves
# with a profile of their own (testkit/kubetest StartScheduler); so is the
# kubelet (--with-kubelet), which testkit/realnode runs over containerd.
# Binaries are built from the published Go modules k8s.io/kubernetes and
# go.etcd.io/etcd/server/v3 through the Go module proxy (the only thing needed
# from the network), once, and cached; later starts need no network at all.
#
# Usage:
#   kube-apiserver.sh build [--with-controller-manager] [--with-scheduler] [--with-kubelet]
#         Build (or reuse cached) binaries: kube-apiserver, etcd, and on request
#         kube-controller-manager, kube-scheduler and kubelet, all from the same
#         k8s.io/kubernetes module and version. Prints their paths, one per line,
#         in that order. The kubelet's first build takes about 7 min on 2 cores.
#   kube-apiserver.sh cached
#         Exit 0 when kube-apiserver and etcd are built (start will not build).
#   kube-apiserver.sh start [-k|--kubeconfig FILE] [-d|--dir DIR] [--owner-pid PID]
#                            [--with-controller-manager[=CONTROLLERS]]
#         Start etcd + kube-apiserver on 127.0.0.1 (random free ports) in a fresh
#         state dir (default: mktemp -d under $TMPDIR), wait for /readyz, and
#         print the kubeconfig path on stdout (nothing else goes to stdout).
#         -k also copies the kubeconfig to FILE. --owner-pid: a watchdog stops
#         everything once PID exits (e.g. pass the test process' PID).
#         The state dir also holds: env (sourceable KUBECONFIG=..., URLs, pids),
#         *.log, *.pid.
#   kube-apiserver.sh stop DIR|KUBECONFIG
#         Stop what `start` started there (by pid) and delete the state dir.
#   kube-apiserver.sh run [start options] -- CMD [ARGS...]
#         start, run CMD with KUBECONFIG (and the env file's variables) exported,
#         then stop, also on failure/Ctrl-C. Exits with CMD's status.
#
# Environment (all optional):
#   KUBE_TEST_CACHE_DIR    binary cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/kube-test-apiserver)
#   KUBE_TEST_K8S_VERSION  k8s.io/kubernetes module version   (default v1.37.2)
#   KUBE_TEST_ETCD_VERSION go.etcd.io/etcd/server/v3 version   (default v3.7.3)
#   KUBE_TEST_APISERVER_BIN, KUBE_TEST_ETCD_BIN, KUBE_TEST_KCM_BIN,
#   KUBE_TEST_SCHEDULER_BIN, KUBE_TEST_KUBELET_BIN  use these binaries instead of building
#   (No ETCD_* names on purpose: etcd reads every ETCD_<FLAG> variable as a
#   flag, e.g. ETCD_VERSION=x acts as --version. They are removed from etcd's
#   environment.)
#   KUBE_TEST_AUTHZ        --authorization-mode (default RBAC; e.g. AlwaysAllow)
#   KUBE_TEST_DISABLE_ADMISSION  --disable-admission-plugins (default ServiceAccount;
#                          that plugin rejects pods until a controller created the
#                          namespace's "default" ServiceAccount)
#   KUBE_TEST_APISERVER_ARGS  extra kube-apiserver flags (split on whitespace)
#   KUBE_TEST_ETCD_ARGS       extra etcd flags (split on whitespace)
#   KUBE_TEST_KCM_ARGS        extra kube-controller-manager flags (split on whitespace;
#                          the controller manager runs at -v=4 already)
#   KUBE_TEST_READY_TIMEOUT   seconds to wait for /readyz (default 120)
#   KUBE_TEST_KEEP_DIR=1   keep the state dir (logs) on stop
#   KUBE_TEST_AUDIT        what the API server's audit log (DIR/audit.log, JSON lines,
#                          level Metadata, stage ResponseComplete) records:
#                          leases (default: every Lease request outside kube-system
#                          and kube-node-lease, so tests and the fleet bench count the
#                          agents' Lease requests by name and verb), all (every request
#                          outside those namespaces), none
#   GOMODCACHE / GOCACHE / GOPROXY / GOTOOLCHAIN are used as the go command sees them.
#
# Requires: bash, go (>= the go line of k8s.io/kubernetes, 1.26 for v1.37), curl,
# openssl (for the ServiceAccount signing key), flock, base64.
set -euo pipefail

KUBE_VERSION=${KUBE_TEST_K8S_VERSION:-v1.37.2}
ETCD_VERSION=${KUBE_TEST_ETCD_VERSION:-v3.7.3}
CACHE_DIR=${KUBE_TEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-test-apiserver}
# Bump when the build recipe below changes, so cached binaries are rebuilt.
BUILD_REV=1
KCM_DEFAULT_CONTROLLERS=disruption-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller

SELF=$(readlink -f "${BASH_SOURCE[0]}")
log() { printf 'kube-test: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Print the path of the go.mod of MODULE@VERSION (downloads the module into the
# module cache; the build needs it anyway).
upstream_gomod() {
	local json
	# A go.mod here keeps the go command from using a module in a parent dir.
	[[ -f $1/go.mod ]] || printf 'module kube-test-scratch\n' >"$1/go.mod"
	json=$(cd "$1" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$2") || die "go mod download $2 failed: $json"
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$json"
}

# ---------------------------------------------------------------- building --

kube_bin_dir() { echo "$CACHE_DIR/kubernetes-$KUBE_VERSION-r$BUILD_REV"; }
etcd_bin_dir() { echo "$CACHE_DIR/etcd-$ETCD_VERSION-r$BUILD_REV"; }

# build_kube CMD...: build k8s.io/kubernetes/cmd/CMD for each CMD missing from the cache.
build_kube() {
	local bindir src cmd missing=() gomod goline staging_ver major minor ldflags p
	bindir=$(kube_bin_dir)
	for cmd in "$@"; do [[ -x $bindir/$cmd ]] || missing+=("$cmd"); done
	((${#missing[@]})) || return 0
	command -v go >/dev/null || die "go is not installed"
	[[ $KUBE_VERSION =~ ^v1\.([0-9]+)\.[0-9]+ ]] || die "KUBE_TEST_K8S_VERSION must look like v1.37.2, got $KUBE_VERSION"
	major=1 minor=${BASH_REMATCH[1]}
	staging_ver=v0.${KUBE_VERSION#v1.} # k8s.io/api etc. are tagged v0.X.Y for Kubernetes v1.X.Y
	src=$CACHE_DIR/src/kubernetes-$KUBE_VERSION
	mkdir -p "$src" "$bindir"
	log "building ${missing[*]} $KUBE_VERSION (first time only; ~7 min on 2 cores from a cold cache)"
	gomod=$(upstream_gomod "$src" "k8s.io/kubernetes@$KUBE_VERSION")
	[[ -f $gomod ]] || die "could not find go.mod of k8s.io/kubernetes@$KUBE_VERSION"
	goline=$(awk '$1 == "go" {print $2; exit}' "$gomod")
	# k8s.io/kubernetes' go.mod says `replace k8s.io/<x> => ./staging/src/k8s.io/<x>`
	# for its staging modules, and those directories are not in the published
	# module; that is why `go install k8s.io/kubernetes/cmd/...@v1.x` fails. A
	# scratch main module maps each staging module it requires (at v0.0.0) to the
	# module published from the same release.
	{
		cat <<EOF
// Generated by start-apiserver.sh: a scratch module that builds Kubernetes'
// own published module k8s.io/kubernetes $KUBE_VERSION. Every k8s.io staging
// module is mapped to its published release $staging_ver.
module kube-test-apiserver-build

go $goline

require k8s.io/kubernetes $KUBE_VERSION

EOF
		grep -E '^godebug ' "$gomod" || true # same GODEBUG defaults as upstream builds
		printf '\nreplace (\n'
		awk -v v="$staging_ver" '
			$2 == "=>" && $3 ~ /^\.\/staging\// { rep[$1] = 1 }
			$2 == "v0.0.0" { req[$1] = 1 }
			END { for (m in rep) if (m in req) printf "\t%s => %s %s\n", m, m, v }' "$gomod" | sort
		echo ')'
	} >"$src/go.mod"
	# Version stamping, as hack/lib/version.sh does (without a git commit).
	ldflags="-s -w"
	for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
		ldflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
		ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	for cmd in "${missing[@]}"; do
		local t0=$SECONDS
		# -mod=mod lets go fill go.sum (checked against the checksum database).
		# Tags/flags as upstream's hack/lib/golang.sh uses for release builds.
		(cd "$src" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
			go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" \
			-o "$bindir/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") || die "building $cmd failed"
		mv -f "$bindir/.$cmd.tmp" "$bindir/$cmd"
		log "built $bindir/$cmd in $((SECONDS - t0))s"
	done
}

build_etcd() {
	local bindir src gomod goline t0=$SECONDS
	bindir=$(etcd_bin_dir)
	[[ -x $bindir/etcd ]] && return 0
	command -v go >/dev/null || die "go is not installed"
	src=$CACHE_DIR/src/etcd-$ETCD_VERSION
	mkdir -p "$src" "$bindir"
	log "building etcd $ETCD_VERSION (first time only; ~1 min)"
	gomod=$(upstream_gomod "$src" "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
	goline=$(awk '$1 == "go" {print $2; exit}' "$gomod")
	# go.etcd.io/etcd/server/v3 holds etcd's main package (a wrapper of etcdmain).
	cat >"$src/go.mod" <<EOF
// Generated by start-apiserver.sh: builds etcd's own published server module.
module kube-test-etcd-build

go $goline

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
	(cd "$src" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
		go build -trimpath -ldflags "-s -w" -o "$bindir/.etcd.tmp" go.etcd.io/etcd/server/v3) ||
		die "building etcd failed"
	mv -f "$bindir/.etcd.tmp" "$bindir/etcd"
	log "built $bindir/etcd in $((SECONDS - t0))s"
}

# ensure_binaries [with_kcm [with_sched [with_kubelet]]]: sets APISERVER, ETCD
# (and KCM, SCHEDULER, KUBELET) to usable binaries.
ensure_binaries() {
	local with_kcm=${1:-} with_sched=${2:-} with_kubelet=${3:-} cmds=()
	APISERVER=${KUBE_TEST_APISERVER_BIN:-$(kube_bin_dir)/kube-apiserver}
	ETCD=${KUBE_TEST_ETCD_BIN:-$(etcd_bin_dir)/etcd}
	KCM=${KUBE_TEST_KCM_BIN:-$(kube_bin_dir)/kube-controller-manager}
	SCHEDULER=${KUBE_TEST_SCHEDULER_BIN:-$(kube_bin_dir)/kube-scheduler}
	KUBELET=${KUBE_TEST_KUBELET_BIN:-$(kube_bin_dir)/kubelet}
	[[ -n ${KUBE_TEST_APISERVER_BIN:-} || -x $APISERVER ]] || cmds+=(kube-apiserver)
	[[ -z $with_kcm || -n ${KUBE_TEST_KCM_BIN:-} || -x $KCM ]] || cmds+=(kube-controller-manager)
	[[ -z $with_sched || -n ${KUBE_TEST_SCHEDULER_BIN:-} || -x $SCHEDULER ]] || cmds+=(kube-scheduler)
	[[ -z $with_kubelet || -n ${KUBE_TEST_KUBELET_BIN:-} || -x $KUBELET ]] || cmds+=(kubelet)
	if [[ ! -x $APISERVER || ! -x $ETCD || (-n $with_kcm && ! -x $KCM) || (-n $with_sched && ! -x $SCHEDULER) ||
		(-n $with_kubelet && ! -x $KUBELET) ]]; then
		mkdir -p "$CACHE_DIR"
		# One builder at a time (parallel test jobs may all call start).
		exec 9>"$CACHE_DIR/.build.lock"
		flock -w 3600 9 || die "timed out waiting for the build lock"
		((${#cmds[@]} == 0)) || build_kube "${cmds[@]}"
		[[ -n ${KUBE_TEST_ETCD_BIN:-} ]] || build_etcd
		exec 9>&-
	fi
	[[ -x $APISERVER ]] || die "no kube-apiserver at $APISERVER"
	[[ -x $ETCD ]] || die "no etcd at $ETCD"
	[[ -z $with_kcm || -x $KCM ]] || die "no kube-controller-manager at $KCM"
	[[ -z $with_sched || -x $SCHEDULER ]] || die "no kube-scheduler at $SCHEDULER"
	[[ -z $with_kubelet || -x $KUBELET ]] || die "no kubelet at $KUBELET"
}

# ---------------------------------------------------------------- running --

PICKED=" "
# pick_port VAR: a currently free loopback TCP port (20000-31999, below the
# usual ephemeral range), different from the ones already picked.
pick_port() {
	local p
	for _ in $(seq 1 500); do
		p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
		[[ $PICKED == *" $p "* ]] && continue
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue # something listens there
		PICKED+="$p "
		printf -v "$1" %s "$p"
		return 0
	done
	die "no free port found"
}

alive() { # alive PID: running and not a zombie
	local state
	[[ -r /proc/$1/stat ]] || return 1
	state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
	[[ -n $state && $state != Z && $state != X ]]
}

# stop_pid DIR NAME: stop the process recorded in DIR/NAME.pid, but only if its
# command line still mentions DIR (guards against pid reuse).
stop_pid() {
	local dir=$1 name=$2 pid
	[[ -f $dir/$name.pid ]] || return 0
	pid=$(<"$dir/$name.pid")
	local cmdline=""
	[[ $pid =~ ^[0-9]+$ ]] && alive "$pid" && cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
	if [[ -n $cmdline && $cmdline == *"$dir"* ]]; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 150); do alive "$pid" || break; sleep 0.1; done
		if alive "$pid"; then
			log "$name (pid $pid) ignored SIGTERM for 15s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true # reap it if it is our own child (run mode)
	fi
	rm -f "$dir/$name.pid"
}

stop_dir() {
	local dir=$1
	[[ -f $dir/kube-test-apiserver.state ]] || die "$dir is not a state dir of kube-apiserver.sh"
	# The watchdog execs `stop` itself (same pid): do not kill ourselves.
	if [[ -f $dir/watchdog.pid && $(<"$dir/watchdog.pid") != "$$" ]]; then stop_pid "$dir" watchdog; fi
	stop_pid "$dir" kube-controller-manager
	stop_pid "$dir" kube-apiserver
	stop_pid "$dir" etcd
	if [[ ${KUBE_TEST_KEEP_DIR:-} == 1 ]]; then
		log "stopped; logs kept in $dir"
	else
		rm -rf "$dir"
	fi
}

# launch DIR NAME BINARY ARGS...: start a server in the background, logs in DIR/NAME.log.
# stdin/stdout/stderr are redirected so that `$(kube-apiserver.sh start)` returns.
launch() {
	local dir=$1 name=$2
	shift 2
	"$@" </dev/null >>"$dir/$name.log" 2>&1 &
	echo $! >"$dir/$name.pid"
}

show_log() {
	if [[ -f $1 ]]; then
		log "---- last lines of $1:"
		tail -n 25 "$1" >&2
	fi
}

# audit_policy DIR ARRAY: writes DIR/audit-policy.yaml for KUBE_TEST_AUDIT and
# appends the audit flags to the array named ARRAY.
audit_policy() {
	local dir=$1 what=${KUBE_TEST_AUDIT:-leases} match
	local -n flags=$2
	case $what in
	none) return 0 ;;
	leases) match='    resources: [{group: coordination.k8s.io, resources: [leases]}]' ;;
	all) match='' ;;
	*) die "KUBE_TEST_AUDIT=$what: want leases, all or none" ;;
	esac
	cat >"$dir/audit-policy.yaml" <<POLICY
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    namespaces: [kube-system, kube-node-lease]
  - level: Metadata
$match
  - level: None
POLICY
	# An empty match line would leave a rule with no selector: every request.
	sed -i '/^$/d' "$dir/audit-policy.yaml"
	flags+=(--audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.log"
		--audit-log-format json --audit-log-maxbackup 1 --audit-log-maxsize 512)
}

# start_servers DIR: one attempt with fresh ports. Returns 2 when a port was taken.
start_servers() {
	local dir=$1 t0 extra_etcd=() extra_api=()
	pick_port ETCD_PORT
	pick_port PEER_PORT
	pick_port API_PORT
	read -r -a extra_etcd <<<"${KUBE_TEST_ETCD_ARGS:-}"
	read -r -a extra_api <<<"${KUBE_TEST_APISERVER_ARGS:-}"
	audit_policy "$dir" extra_api
	: >"$dir/etcd.log"
	: >"$dir/kube-apiserver.log"
	t0=$(date +%s%N)
	# etcd: single member, loopback only, no fsync (test data is throw-away).
	local unset_etcd_env=() k
	for k in $(compgen -e); do [[ $k == ETCD_* ]] && unset_etcd_env+=(-u "$k"); done
	launch "$dir" etcd env "${unset_etcd_env[@]}" "$ETCD" --name kube-test --data-dir "$dir/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
		--initial-cluster "kube-test=http://127.0.0.1:$PEER_PORT" --initial-cluster-state new \
		--unsafe-no-fsync --log-level warn "${extra_etcd[@]}"
	for _ in $(seq 1 300); do
		curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break
		if ! alive "$(<"$dir/etcd.pid")"; then
			grep -q 'address already in use' "$dir/etcd.log" && return 2
			show_log "$dir/etcd.log"
			die "etcd exited during startup"
		fi
		sleep 0.1
	done
	curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 || { show_log "$dir/etcd.log"; die "etcd not healthy after 30s"; }
	# kube-apiserver:
	#  - self-signed serving cert generated into certs/ (SANs include 127.0.0.1);
	#  - static token file: one admin user in group system:masters;
	#  - authorization RBAC by default (system:masters bypasses it; tests can bind
	#    ClusterRoles to other users/ServiceAccounts and impersonate them);
	#  - endpoint reconciler off: it refuses a loopback advertise address;
	#  - ServiceAccount signing key: makes TokenRequest and SA token auth work.
	launch "$dir" kube-apiserver "$APISERVER" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
		--endpoint-reconciler-type none \
		--cert-dir "$dir/certs" \
		--token-auth-file "$dir/tokens.csv" \
		--authorization-mode "${KUBE_TEST_AUTHZ:-RBAC}" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$dir/sa.key" --service-account-signing-key-file "$dir/sa.key" \
		--service-cluster-ip-range 10.0.0.0/24 \
		--disable-admission-plugins "${KUBE_TEST_DISABLE_ADMISSION-ServiceAccount}" \
		--allow-privileged=true \
		"${extra_api[@]}"
	local deadline=$((SECONDS + ${KUBE_TEST_READY_TIMEOUT:-120}))
	while ((SECONDS < deadline)); do
		if [[ -f $dir/certs/apiserver.crt ]] && [[ $(curl -s --cacert "$dir/certs/apiserver.crt" \
			-H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null) == ok ]]; then
			READY_MS=$((($(date +%s%N) - t0) / 1000000))
			return 0
		fi
		if ! alive "$(<"$dir/kube-apiserver.pid")"; then
			if grep -q 'address already in use' "$dir/kube-apiserver.log"; then stop_pid "$dir" etcd; return 2; fi
			show_log "$dir/kube-apiserver.log"
			die "kube-apiserver exited during startup"
		fi
		sleep 0.1
	done
	show_log "$dir/kube-apiserver.log"
	die "kube-apiserver not ready after ${KUBE_TEST_READY_TIMEOUT:-120}s"
}

write_kubeconfig() { # write_kubeconfig FILE
	(
		umask 077
		cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$STATE_DIR/certs/apiserver.crt")
users:
- name: kube-test-admin
  user:
    token: $TOKEN
contexts:
- name: kube-test
  context:
    cluster: kube-test
    user: kube-test-admin
current-context: kube-test
EOF
	)
}

START_OK=
on_start_exit() {
	[[ -n $START_OK || -z ${STATE_DIR:-} || ! -d ${STATE_DIR:-} ]] && return 0
	log "start failed; stopping what was started"
	[[ ${KUBE_TEST_KEEP_DIR:-} == 1 ]] || log "(set KUBE_TEST_KEEP_DIR=1 to keep $STATE_DIR for debugging)"
	stop_dir "$STATE_DIR" || true
}

# do_start ARGS...: sets STATE_DIR and KUBECONFIG_PATH; prints nothing on stdout.
do_start() {
	local kubeconfig_out="" owner_pid="" with_kcm="" controllers="" rc
	STATE_DIR=""
	while (($#)); do
		case $1 in
		-k | --kubeconfig) kubeconfig_out=${2:?}; shift 2 ;;
		-d | --dir) STATE_DIR=${2:?}; shift 2 ;;
		--owner-pid) owner_pid=${2:?}; shift 2 ;;
		--with-controller-manager) with_kcm=1 controllers=$KCM_DEFAULT_CONTROLLERS; shift ;;
		--with-controller-manager=*) with_kcm=1 controllers=${1#*=}; shift ;;
		*) die "unknown start option: $1" ;;
		esac
	done
	for t in curl openssl base64 flock; do command -v "$t" >/dev/null || die "$t is required"; done
	ensure_binaries "$with_kcm"
	if [[ -n $STATE_DIR ]]; then
		[[ ! -e $STATE_DIR || -z $(ls -A "$STATE_DIR") ]] || die "$STATE_DIR exists and is not empty"
		mkdir -p "$STATE_DIR"
	else
		STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kube-test-apiserver.XXXXXX")
	fi
	STATE_DIR=$(readlink -f "$STATE_DIR")
	chmod 700 "$STATE_DIR"
	echo "started by $SELF" >"$STATE_DIR/kube-test-apiserver.state"
	trap on_start_exit EXIT
	(
		umask 077
		# A random admin token, valid only for this throw-away server.
		TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
		echo "$TOKEN,kube-test-admin,kube-test-admin,system:masters" >"$STATE_DIR/tokens.csv"
		# SEC1 "EC PRIVATE KEY": kube-apiserver reads ECDSA keys in that form (not PKCS#8).
		openssl ecparam -name prime256v1 -genkey -noout -out "$STATE_DIR/sa.key" 2>/dev/null
	) || die "could not create credentials"
	TOKEN=$(cut -d, -f1 "$STATE_DIR/tokens.csv")
	for _ in 1 2 3; do
		rc=0
		start_servers "$STATE_DIR" || rc=$?
		((rc == 0)) && break
		((rc == 2)) || die "start failed"
		log "a port was taken meanwhile; retrying with other ports"
		rm -rf "$STATE_DIR/etcd" "$STATE_DIR/certs"
	done
	((rc == 0)) || die "could not start after 3 attempts"
	KUBECONFIG_PATH=$STATE_DIR/kubeconfig
	write_kubeconfig "$KUBECONFIG_PATH"
	log "kube-apiserver $("$APISERVER" --version | awk '{print $2}') ready on https://127.0.0.1:$API_PORT after ${READY_MS}ms (etcd on :$ETCD_PORT); state in $STATE_DIR"
	if [[ -n $with_kcm ]]; then
		# kube-controller-manager with a few controllers that make sense without
		# kubelets (PDB status, ownerRef GC, namespace deletion, default SAs).
		local extra_kcm
		read -r -a extra_kcm <<<"${KUBE_TEST_KCM_ARGS:-}"
		# StaleControllerConsistencyDaemonSet (beta, on by default since 1.36)
		# makes the DaemonSet controller skip a sync until its pod informer has
		# seen its own last pod write (pkg/controller/daemon syncDaemonSet,
		# consistencyStore.EnsureReady). Under the scenario tests' load on 2
		# cores that informer was seen stuck behind such a write for over a
		# minute ("read version: 4675 is not as new as written version: 4912
		# for group resource pods", retried with backoff), so the DaemonSet never
		# replaced the plugin pod a test waited for. Off, the controller syncs
		# from its cache with its expectations, as every release before 1.36.
		# -v=4: the DaemonSet controller logs each pod it sees added or
		# deleted and each sync, which a failed test shows (kubetest explain).
		launch "$STATE_DIR" kube-controller-manager "$KCM" --kubeconfig "$KUBECONFIG_PATH" \
			--controllers "$controllers" --leader-elect=false --secure-port 0 \
			--feature-gates StaleControllerConsistencyDaemonSet=false \
			--use-service-account-credentials=false -v=4 "${extra_kcm[@]}"
		sleep 1
		alive "$(<"$STATE_DIR/kube-controller-manager.pid")" || { show_log "$STATE_DIR/kube-controller-manager.log"; die "kube-controller-manager exited"; }
		log "kube-controller-manager running controllers: $controllers"
	fi
	cat >"$STATE_DIR/env" <<EOF
KUBECONFIG=$KUBECONFIG_PATH
KUBE_TEST_STATE_DIR=$STATE_DIR
KUBE_TEST_APISERVER_URL=https://127.0.0.1:$API_PORT
KUBE_TEST_ETCD_URL=http://127.0.0.1:$ETCD_PORT
KUBE_TEST_APISERVER_PID=$(<"$STATE_DIR/kube-apiserver.pid")
KUBE_TEST_ETCD_PID=$(<"$STATE_DIR/etcd.pid")
EOF
	if [[ -n $kubeconfig_out ]]; then
		mkdir -p "$(dirname "$kubeconfig_out")"
		install -m 600 "$KUBECONFIG_PATH" "$kubeconfig_out"
	fi
	if [[ -n $owner_pid ]]; then
		bash "$SELF" __watchdog "$owner_pid" "$STATE_DIR" </dev/null >/dev/null 2>&1 &
		echo $! >"$STATE_DIR/watchdog.pid"
	fi
	START_OK=1
	trap - EXIT
}

cmd=${1:-}
[[ -n $cmd ]] && shift
case $cmd in
cached)
	[[ -x ${KUBE_TEST_APISERVER_BIN:-$(kube_bin_dir)/kube-apiserver} && -x ${KUBE_TEST_ETCD_BIN:-$(etcd_bin_dir)/etcd} ]]
	;;
build)
	kcm="" sched="" kubelet=""
	while (($#)); do
		case $1 in
		--with-controller-manager) kcm=1 ;;
		--with-scheduler) sched=1 ;;
		--with-kubelet) kubelet=1 ;;
		*) die "unknown build option: $1" ;;
		esac
		shift
	done
	ensure_binaries "$kcm" "$sched" "$kubelet"
	printf '%s\n' "$APISERVER" "$ETCD"
	[[ -z $kcm ]] || echo "$KCM"
	[[ -z $sched ]] || echo "$SCHEDULER"
	[[ -z $kubelet ]] || echo "$KUBELET"
	;;
start)
	do_start "$@"
	echo "$KUBECONFIG_PATH"
	;;
stop)
	target=${1:?usage: stop DIR|KUBECONFIG}
	[[ -f $target ]] && target=$(dirname "$target")
	stop_dir "$(readlink -f "$target")"
	;;
run)
	opts=()
	while (($#)) && [[ $1 != -- ]]; do opts+=("$1"); shift; done
	[[ ${1:-} == -- ]] && shift
	(($#)) || die "usage: run [start options] -- CMD [ARGS...]"
	do_start "${opts[@]}"
	trap 'stop_dir "$STATE_DIR"' EXIT
	set -a
	# shellcheck disable=SC1091
	. "$STATE_DIR/env"
	set +a
	# Run CMD as a background child (stdin kept) and wait for it: bash runs
	# traps only between commands, so a foreground CMD would delay them. A
	# TERM/INT sent to this script is passed on to CMD, then the servers stop.
	"$@" <&0 &
	child=$!
	# shellcheck disable=SC2317 # invoked from the traps below
	forward() { kill "-$1" "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; exit "$2"; }
	trap 'forward INT 130' INT
	trap 'forward TERM 143' TERM
	rc=0
	wait "$child" || rc=$?
	exit "$rc"
	;;
__watchdog) # internal: __watchdog OWNER_PID DIR
	while alive "$1" && [[ -d $2 ]]; do sleep 1; done
	if [[ -d $2 ]]; then exec bash "$SELF" stop "$2"; fi
	;;
*)
	sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
