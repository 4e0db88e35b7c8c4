//! QP state machine and the `ibv_modify_qp` attribute-mask rules for RC.
//!
//! ```text
//! //= IBTA Vol 1 §10.3.1, Figure 124 "QP/EE State Diagram" (RC subset)
//! //#           create
//! //#             |
//! //#   +----> RESET --(modify)--> INIT --(modify)--> RTR --(modify)--> RTS <--> SQD
//! //#   |        ^                  |  ^                |                |        |
//! //#   |        +---- any state ---+--+----------------+----------------+--------+
//! //#   |                 (modify to RESET / ERR always allowed)
//! //#   +--------------- ERR <-- (modify, or a fatal error detected by the QP)
//! ```
//!
//! The required/optional masks per transition follow the IBA table that
//! the Linux kernel encodes as `qp_state_table` in
//! `drivers/infiniband/core/verbs.c` (`ib_modify_qp_is_ok`), RC column.

use super::attr_mask as m;

/// `enum ibv_qp_state` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum QpState {
    #[default]
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

impl QpState {
    pub fn from_ibv(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// One row of the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: QpState,
    pub to: QpState,
    /// Attributes that must be in the mask (besides `STATE`).
    pub required: u32,
    /// Attributes that may be in the mask.
    pub optional: u32,
}

const fn t(from: QpState, to: QpState, required: u32, optional: u32) -> Transition {
    Transition {
        from,
        to,
        required,
        optional,
    }
}

use QpState::{Init, Reset, Rtr, Rts, Sqd};

/// The RC transition table. Transitions to RESET and ERR from any state are
/// handled separately (always legal, no attributes).
pub const TRANSITIONS: &[Transition] = &[
    //= IBTA §11.2.4.2 / kernel qp_state_table[RESET][INIT], IB_QPT_RC
    //# required: IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS
    t(Reset, Init, m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS, 0),
    //# [INIT][INIT] optional: PKEY_INDEX | PORT | ACCESS_FLAGS
    t(Init, Init, 0, m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS),
    //# [INIT][RTR] required: AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
    //#             optional: ALT_PATH | ACCESS_FLAGS | PKEY_INDEX
    t(
        Init,
        Rtr,
        m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN | m::MAX_DEST_RD_ATOMIC | m::MIN_RNR_TIMER,
        m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX,
    ),
    //# [RTR][RTS] required: SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC
    //#            optional: CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE
    t(
        Rtr,
        Rts,
        m::SQ_PSN | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC,
        m::CUR_STATE | m::ALT_PATH | m::ACCESS_FLAGS | m::MIN_RNR_TIMER | m::PATH_MIG_STATE,
    ),
    //# [RTS][RTS] optional: CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER
    t(
        Rts,
        Rts,
        0,
        m::CUR_STATE | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE | m::MIN_RNR_TIMER,
    ),
    //# [RTS][SQD] optional: EN_SQD_ASYNC_NOTIFY
    t(Rts, Sqd, 0, m::EN_SQD_ASYNC_NOTIFY),
    //# [SQD][RTS] optional: CUR_STATE | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE | ALT_PATH
    t(
        Sqd,
        Rts,
        0,
        m::CUR_STATE | m::ACCESS_FLAGS | m::MIN_RNR_TIMER | m::PATH_MIG_STATE | m::ALT_PATH,
    ),
    //# [SQD][SQD] optional: PKEY_INDEX | QKEY | AV | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER |
    //#   PATH_MIG_STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC | MAX_DEST_RD_ATOMIC
    t(
        Sqd,
        Sqd,
        0,
        m::PKEY_INDEX
            | m::AV
            | m::ALT_PATH
            | m::ACCESS_FLAGS
            | m::MIN_RNR_TIMER
            | m::PATH_MIG_STATE
            | m::TIMEOUT
            | m::RETRY_CNT
            | m::RNR_RETRY
            | m::MAX_QP_RD_ATOMIC
            | m::MAX_DEST_RD_ATOMIC,
    ),
];

/// Why a transition was refused (all map to EINVAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// No such edge in the state diagram.
    Illegal { from: QpState, to: QpState },
    /// A required attribute is missing from the mask.
    MissingAttrs { missing: u32 },
    /// An attribute not allowed on this edge is in the mask.
    ExtraAttrs { extra: u32 },
}

/// Check `from → to` with `mask` (which may include `STATE`/`CUR_STATE`).
pub fn check_transition(from: QpState, to: QpState, mask: u32) -> Result<(), TransitionError> {
    let attrs = mask & !m::STATE;
    //= IBTA §10.3.1
    //# A QP may be transitioned to the Reset or Error state from any state.
    if to == Reset || to == QpState::Err {
        // The kernel table allows no attributes except CUR_STATE here.
        let extra = attrs & !m::CUR_STATE;
        if extra != 0 {
            return Err(TransitionError::ExtraAttrs { extra });
        }
        return Ok(());
    }
    let Some(row) = TRANSITIONS.iter().find(|r| r.from == from && r.to == to) else {
        return Err(TransitionError::Illegal { from, to });
    };
    let missing = row.required & !attrs;
    if missing != 0 {
        return Err(TransitionError::MissingAttrs { missing });
    }
    let extra = attrs & !(row.required | row.optional);
    if extra != 0 {
        return Err(TransitionError::ExtraAttrs { extra });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [QpState; 7] = [Reset, Init, Rtr, Rts, Sqd, QpState::Sqe, QpState::Err];

    #[test]
    fn every_legal_transition_accepted_with_required_mask() {
        for r in TRANSITIONS {
            assert_eq!(check_transition(r.from, r.to, m::STATE | r.required), Ok(()), "{r:?}");
            assert_eq!(
                check_transition(r.from, r.to, m::STATE | r.required | r.optional),
                Ok(()),
                "{r:?}"
            );
        }
        for s in ALL {
            assert_eq!(check_transition(s, Reset, m::STATE), Ok(()));
            assert_eq!(check_transition(s, QpState::Err, m::STATE), Ok(()));
        }
    }

    #[test]
    fn illegal_transitions_rejected() {
        for from in ALL {
            for to in ALL {
                if to == Reset || to == QpState::Err || TRANSITIONS.iter().any(|r| r.from == from && r.to == to) {
                    continue;
                }
                assert_eq!(
                    check_transition(from, to, u32::MAX),
                    Err(TransitionError::Illegal { from, to }),
                    "{from:?}->{to:?}"
                );
            }
        }
        // Spot checks of the classic mistakes.
        assert!(check_transition(Reset, Rtr, m::STATE).is_err());
        assert!(check_transition(Init, Rts, m::STATE).is_err());
        assert!(check_transition(Rtr, Rtr, m::STATE).is_err());
        assert!(check_transition(QpState::Err, Rts, m::STATE).is_err());
    }

    #[test]
    fn each_required_attr_enforced() {
        for r in TRANSITIONS {
            for bit in 0..32 {
                let b = 1u32 << bit;
                if r.required & b == 0 {
                    continue;
                }
                assert_eq!(
                    check_transition(r.from, r.to, m::STATE | (r.required & !b)),
                    Err(TransitionError::MissingAttrs { missing: b }),
                    "{r:?} without bit {bit}"
                );
            }
        }
    }

    #[test]
    fn extra_attrs_rejected() {
        assert_eq!(
            check_transition(
                Reset,
                Init,
                m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS | m::SQ_PSN
            ),
            Err(TransitionError::ExtraAttrs { extra: m::SQ_PSN })
        );
        assert_eq!(
            check_transition(Rts, Rts, m::TIMEOUT),
            Err(TransitionError::ExtraAttrs { extra: m::TIMEOUT })
        );
    }
}
