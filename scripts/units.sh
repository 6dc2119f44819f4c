# Sourced by bootstrap.sh. Debian's postinst scripts enable the services they install
# (mariadb.service, postgresql.service): a systemd host would start a system MariaDB on
# 3306 at the next boot. The stack runs its own servers from .cdc/, so a service the
# install enabled is disabled again; one the host had enabled before stays enabled.
# Needs: STATE (the .cdc dir), SUDO (empty or sudo), say(). SYSTEMD_ETC for tests.
SERVICES=(mariadb.service postgresql.service)
SYSTEMD_ETC="${SYSTEMD_ETC:-/etc/systemd/system}"

enabled_units() {
  local unit
  for unit in "${SERVICES[@]}"; do
    if compgen -G "$SYSTEMD_ETC/*.wants/$unit" >/dev/null; then echo "$unit"; fi
  done
  return 0
}

restore_units() {  # $1: the units enabled before the install, one per line
  local unit
  for unit in $(enabled_units); do
    grep -qx "$unit" <<<"$1" && continue
    if [[ "$SYSTEMD_ETC" == /etc/systemd/system ]] && command -v deb-systemd-helper >/dev/null; then
      # also forgets the package's 'enabled' state, so an upgrade does not enable it again
      $SUDO env DPKG_MAINTSCRIPT_PACKAGE="${unit%.service}" deb-systemd-helper disable "$unit" >/dev/null 2>&1 || true
    fi
    $SUDO rm -f "$SYSTEMD_ETC"/*.wants/"$unit"
    mkdir -p "$STATE/stamps"
    echo "$unit" >> "$STATE/stamps/units-left-disabled"
    say "left $unit disabled, as it was before the install (the stack runs its own server)"
  done
  return 0
}
