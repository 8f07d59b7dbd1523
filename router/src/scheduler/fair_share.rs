//! `SchedulingPolicy::Fair`'s bookkeeping: a virtual time per API key (start-time fair
//! queuing). A key's virtual time advances by the tokens served to it divided by its weight,
//! so while several keys have requests, each is served tokens in proportion to its weight.

use std::collections::HashMap;

use crate::tenant::{KeyId, Tenant};

/// The tenant a request's tokens are charged to: its key, or `None` for every request that
/// came without one.
pub(crate) type TenantKey = Option<KeyId>;

/// Virtual times of the tenants seen since the scheduler last ran out of requests.
///
/// Invariant: every tenant with a waiting or running request has a virtual time here.
#[derive(Debug, Default)]
pub(crate) struct FairShare {
    virtual_times: HashMap<TenantKey, f64>,
}

impl FairShare {
    /// The virtual time of `tenant` (0 before it was first served).
    pub fn virtual_time(&self, tenant: TenantKey) -> f64 {
        self.virtual_times.get(&tenant).copied().unwrap_or(0.0)
    }

    /// `tenant`, which had no waiting or running request, has one again. It rejoins at the
    /// lowest virtual time of the tenants that stayed busy (`None`: no tenant was busy), or at
    /// its own if that is higher: idling banks no credit, and leaving sheds no debt. With no
    /// busy tenant every earlier claim lapses and all start again from 0.
    pub fn rejoin(&mut self, tenant: TenantKey, busy_floor: Option<f64>) {
        let Some(floor) = busy_floor else {
            self.virtual_times.clear();
            self.virtual_times.insert(tenant, 0.0);
            return;
        };
        let time = self.virtual_times.entry(tenant).or_insert(floor);
        *time = time.max(floor);
    }

    /// Advances the virtual time of `tenant` by `tokens` served, divided by its weight.
    pub fn charge(&mut self, tenant: Option<Tenant>, tokens: usize) {
        let (key, weight) =
            tenant.map_or((None, 1), |tenant| (Some(tenant.key), tenant.weight.get()));
        *self.virtual_times.entry(key).or_insert(0.0) += tokens as f64 / f64::from(weight);
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn tenant(name: &str, weight: u32) -> Tenant {
        Tenant {
            key: KeyId::of(name.as_bytes()),
            weight: NonZeroU32::new(weight).unwrap(),
            name: None,
        }
    }

    #[test]
    fn virtual_time_advances_by_tokens_over_weight() {
        let (heavy, light) = (tenant("heavy", 4), tenant("light", 1));
        let mut share = FairShare::default();
        share.charge(Some(heavy), 8);
        share.charge(Some(light), 8);
        share.charge(None, 3);
        assert_eq!(share.virtual_time(Some(heavy.key)), 2.0);
        assert_eq!(share.virtual_time(Some(light.key)), 8.0);
        assert_eq!(share.virtual_time(None), 3.0);
    }

    #[test]
    fn a_rejoining_tenant_starts_at_the_busy_floor_but_keeps_its_debt() {
        let (idle, indebted) = (tenant("idle", 1), tenant("indebted", 1));
        let mut share = FairShare::default();
        share.charge(Some(indebted), 50);
        share.rejoin(Some(idle.key), Some(20.0));
        share.rejoin(Some(indebted.key), Some(20.0));
        assert_eq!(share.virtual_time(Some(idle.key)), 20.0);
        assert_eq!(share.virtual_time(Some(indebted.key)), 50.0);
        share.rejoin(Some(idle.key), None);
        assert_eq!(share.virtual_time(Some(idle.key)), 0.0);
        assert_eq!(
            share.virtual_time(Some(indebted.key)),
            0.0,
            "claims lapse when idle"
        );
    }
}
