#!/usr/bin/env python3
"""Static checks of the deployment files (no Docker engine runs here).

Usage: compose_check.py [REPOSITORY]

- docker-compose.yml parses; `docker compose up` starts postgres, adtally,
  prometheus and grafana, and the Citus services only under the `citus` profile;
  every service has an image or a build; every build context and Dockerfile,
  every bind-mounted path exists; named volumes are declared; depends_on names
  services and no default service depends on an opt-in one; host ports differ;
  every ${VAR} has a default, so it comes up with nothing set.
- Prometheus scrapes compose services on the port the server listens on.
- Grafana: every provisioned file parses; every dashboard under Dashboards/
  parses and every panel, target, variable and annotation names a provisioned
  datasource; the ${VARS} of the provisioning are set on the grafana service.
- Dockerfile: every COPY source exists; the build stage builds with the
  Makefile's own `build-release` target (the one `make run` uses) and the
  dependency script in its build-only mode; the runtime stage carries the
  migrations and checks /readyz, a route the server has.
- The PostgreSQL images install hll for the server major they run.
Prints what it checked; exits 1 with every problem found.
"""
import json
import os
import re
import sys

import yaml

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
problems = []
checked = []


def problem(text):
    problems.append(text)


def path(*parts):
    return os.path.join(root, *parts)


def load_yaml(relative):
    with open(path(relative)) as handle:
        return yaml.safe_load(handle)


# --- docker-compose.yml -------------------------------------------------------
compose_text = open(path("docker-compose.yml")).read()
compose = yaml.safe_load(compose_text)
services = compose.get("services") or {}
volumes = set((compose.get("volumes") or {}).keys())
default_services = {name for name, service in services.items() if not service.get("profiles")}
if default_services != {"postgres", "adtally", "prometheus", "grafana"}:
    problem(f"`docker compose up` would start {sorted(default_services)}, not postgres, adtally, prometheus and grafana")
for name, service in services.items():
    profiles = service.get("profiles")
    if profiles and profiles != ["citus"]:
        problem(f"{name}: profiles {profiles}; the only opt-in profile is citus")
    if name.startswith("citus") or name.startswith("adtally-citus"):
        if profiles != ["citus"]:
            problem(f"{name}: a Citus service outside the citus profile")
    if "image" not in service and "build" not in service:
        problem(f"{name}: neither image nor build")
    build = service.get("build")
    if build is not None:
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        if not os.path.isdir(path(context)):
            problem(f"{name}: build context {context} does not exist")
        elif not os.path.isfile(path(context, dockerfile)):
            problem(f"{name}: {context}/{dockerfile} does not exist")
    for mount in service.get("volumes") or []:
        source = mount.split(":")[0] if isinstance(mount, str) else mount.get("source")
        if source.startswith(".") or source.startswith("/"):
            if not os.path.exists(path(source)):
                problem(f"{name}: mounts {source}, which does not exist")
        elif source not in volumes:
            problem(f"{name}: named volume {source} is not declared under volumes")
    service_networks = service.get("networks") or ["default"]
    for network in (service_networks if isinstance(service_networks, list) else service_networks.keys()):
        if network != "default" and network not in (compose.get("networks") or {}):
            problem(f"{name}: network {network} is not declared under networks")
    if name.startswith("citus") and "default" in service_networks:
        problem(f"{name}: a Citus node (trusting its network) is on the default network, where Grafana is")
    depends = service.get("depends_on") or []
    for dependency in (depends if isinstance(depends, list) else depends.keys()):
        if dependency not in services:
            problem(f"{name}: depends on {dependency}, which is not a service")
        elif name in default_services and dependency not in default_services:
            problem(f"{name}: depends on the opt-in service {dependency}")
    checked.append(f"service {name}" + (f" (profile {profiles[0]})" if profiles else ""))
host_ports = [str(port).split(":")[0] for service in services.values() for port in service.get("ports") or []]
if len(host_ports) != len(set(host_ports)):
    problem(f"host ports used twice: {host_ports}")
for variable in re.findall(r"\$\{([^}]*)\}", compose_text):
    if ":-" not in variable:
        problem(f"${{{variable}}} has no default: `docker compose up` would need it set")
server_port = "8080"
for name in ("adtally", "adtally-citus-1", "adtally-citus-2"):
    environment = services.get(name, {}).get("environment") or {}
    if environment.get("ADTALLY_PORT", server_port) != server_port:
        problem(f"{name}: listens on {environment.get('ADTALLY_PORT')}, not {server_port}")
    if "DATABASE_URL" not in environment:
        problem(f"{name}: no DATABASE_URL (it would start an embedded cluster inside the container)")

# --- Prometheus -----------------------------------------------------------------
prometheus = load_yaml("Dashboards/prometheus.yml")
for job in prometheus["scrape_configs"]:
    for config in job.get("static_configs", []):
        for target in config["targets"]:
            host, _, port = target.partition(":")
            if host not in services or port != server_port:
                problem(f"prometheus scrapes {target}: not a compose service on port {server_port}")
checked.append("prometheus targets")
# Each rule file Prometheus loads is mounted beside its configuration in the container.
prometheus_mounts = {}
for mount in services["prometheus"].get("volumes") or []:
    source, _, rest = mount.partition(":")
    prometheus_mounts[rest.split(":")[0]] = source
config_folder = os.path.dirname(next((target for target, source in prometheus_mounts.items() if source.endswith("Dashboards/prometheus.yml")), "/etc/prometheus/prometheus.yml"))
for rule_file in prometheus.get("rule_files") or []:
    target = os.path.join(config_folder, rule_file)
    if target not in prometheus_mounts:
        problem(f"prometheus loads {rule_file}, but nothing is mounted at {target}")
    elif not os.path.isfile(path(prometheus_mounts[target])):
        problem(f"prometheus's {target} is mounted from {prometheus_mounts[target]}, which does not exist")
checked.append("prometheus rule files")

# --- Grafana --------------------------------------------------------------------
grafana_environment = services["grafana"].get("environment") or {}
datasource_uids = {"-- Grafana --", "grafana"}
for folder in ("datasources", "dashboards"):
    for file in sorted(os.listdir(path("Dashboards/provisioning", folder))):
        text = open(path("Dashboards/provisioning", folder, file)).read()
        document = yaml.safe_load(text)
        for variable in re.findall(r"\$\{([A-Za-z0-9_]+)\}", text):
            if variable not in grafana_environment:
                problem(f"provisioning/{folder}/{file} reads ${{{variable}}}, which the grafana service does not set")
        if folder == "datasources":
            for source in document["datasources"]:
                datasource_uids.add(source["uid"])
        checked.append(f"provisioning/{folder}/{file}")
dashboard_files = sorted(f for f in os.listdir(path("Dashboards")) if f.endswith(".json"))
for file in dashboard_files:
    dashboard = json.load(open(path("Dashboards", file)))
    def check_datasource(where, datasource):
        if isinstance(datasource, dict) and datasource.get("uid") not in datasource_uids:
            problem(f"{file}: {where} uses datasource {datasource.get('uid')}, which is not provisioned")
    for panel in dashboard.get("panels", []):
        check_datasource(f"panel {panel.get('title')}", panel.get("datasource"))
        for target in panel.get("targets", []):
            check_datasource(f"panel {panel.get('title')}", target.get("datasource"))
    for variable in dashboard.get("templating", {}).get("list", []):
        check_datasource(f"variable {variable.get('name')}", variable.get("datasource"))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        check_datasource(f"annotation {annotation.get('name')}", annotation.get("datasource"))
    checked.append(f"dashboard {file} ({len(dashboard.get('panels', []))} panels)")
provider = load_yaml("Dashboards/provisioning/dashboards/adtally.yml")["providers"][0]["options"]["path"]
if not any(str(mount).startswith("./Dashboards:" + provider) for mount in services["grafana"].get("volumes", [])):
    problem(f"grafana's dashboard provider reads {provider}, where ./Dashboards is not mounted")

# --- Dockerfile -----------------------------------------------------------------
dockerfile = open(path("Dockerfile")).read()
joined = re.sub(r"\\\n", " ", dockerfile)
for line in joined.splitlines():
    match = re.match(r"\s*COPY\s+(?!--from)(.*)", line)
    if match:
        for source in match.group(1).split()[:-1]:
            if not os.path.exists(path(source)):
                problem(f"Dockerfile copies {source}, which does not exist")
build_stage = joined.split("FROM ")[1]
if not re.search(r"ADTALLY_DEPS=build make build-release\b", build_stage):
    problem("the Dockerfile's build stage does not build with `make build-release` (the target `make run` uses)")
makefile = open(path("Makefile")).read()
recipe = re.search(r"^build-release:.*\n((?:\t.*\n)+)", makefile, re.M)
if not recipe or "build -c release --product adtally" not in recipe.group(1):
    problem("the Makefile's build-release target does not build the adtally product in release")
if "scripts/install-deps.sh" not in makefile or 'ADTALLY_DEPS:-all}" != build' not in open(path("scripts/install-deps.sh")).read():
    problem("the dependency script has no build-only mode for the Dockerfile")
for needed in ("Package.swift", "Sources", "Tests", "Makefile", "scripts"):
    if not re.search(rf"COPY [^\n]*\b{re.escape(needed)}\b", build_stage):
        problem(f"the build stage does not copy {needed}, which the build reads")
runtime = joined.split("FROM ")[-1]
if "COPY Migrations" not in runtime or "ADTALLY_MIGRATIONS_DIR" not in runtime:
    problem("the runtime image does not carry the migrations")
readiness = re.search(r"HEALTHCHECK.*?http://[^/ ]+(/\w+)", runtime)
routes = open(path("Sources/AdTallyHTTP/Operations/HealthRoutes.swift")).read()
if not readiness or f'"{readiness.group(1).lstrip("/")}"' not in routes:
    problem("the Dockerfile's HEALTHCHECK does not ask a route the server has")
checked.append("Dockerfile")

# --- PostgreSQL images ------------------------------------------------------------
postgres_image = open(path("deploy/postgres/Dockerfile")).read()
major = re.search(r"FROM postgres:(\d+)", postgres_image)
if not major or f"postgresql-{major.group(1)}-hll" not in postgres_image:
    problem("deploy/postgres/Dockerfile does not install hll for its PostgreSQL major")
# The Citus nodes run the same major as the single-node image, with Citus 12.1 and hll
# for it, Citus preloaded, and the extension created in each new database.
citus_image = open(path("deploy/citus/Dockerfile")).read()
citus_major = re.search(r"FROM postgres:(\d+)", citus_image)
if not citus_major or not major or citus_major.group(1) != major.group(1):
    problem("deploy/citus/Dockerfile is not on the PostgreSQL major of deploy/postgres/Dockerfile")
elif (f"postgresql-{citus_major.group(1)}-citus-12.1" not in citus_image
      or f"postgresql-{citus_major.group(1)}-hll" not in citus_image):
    problem("deploy/citus/Dockerfile does not install Citus 12.1 and hll for its PostgreSQL major")
if "shared_preload_libraries='citus'" not in citus_image:
    problem("deploy/citus/Dockerfile does not preload citus")
for match in re.finditer(r"^COPY\s+(\S+)\s", citus_image, re.M):
    if not os.path.exists(path(os.path.join("deploy/citus", match.group(1)))):
        problem(f"deploy/citus/Dockerfile copies {match.group(1)}, which deploy/citus lacks")
checked.append("PostgreSQL images")

for line in checked:
    print(f"checked {line}")
if problems:
    for line in problems:
        print(f"PROBLEM: {line}", file=sys.stderr)
    sys.exit(1)
print(f"compose check: {len(checked)} things, no problem")
