"""Step ordering: Steps run in id order whatever order they arrive in; a failed Step or a reset refuses the rest."""

from __future__ import annotations

import asyncio

import pytest
from tandem_server.errors import InvalidStepError, StepRefusedError
from tandem_server.rpc.step_order import StepOrder


async def take_turns(order: StepOrder, arrivals: list[int], ran: list[int]) -> None:
    lock = asyncio.Lock()

    async def step(step_id: int) -> None:
        generation = await order.wait_for_turn(step_id)
        async with lock:
            order.check_current(step_id, generation)
            ran.append(step_id)
            await asyncio.sleep(0)

    tasks = []
    for step_id in arrivals:
        tasks.append(asyncio.create_task(step(step_id)))
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)


def test_steps_run_in_id_order_whatever_order_they_arrive_in() -> None:
    async def scenario() -> list[int]:
        order = StepOrder()
        ran: list[int] = []
        await take_turns(order, [7], ran)
        await take_turns(order, [10, 9, 8], ran)
        return ran

    assert asyncio.run(scenario()) == [7, 8, 9, 10]


def test_a_step_that_already_had_its_turn_is_rejected() -> None:
    async def scenario() -> None:
        order = StepOrder()
        await order.wait_for_turn(3)
        await order.wait_for_turn(4)
        with pytest.raises(InvalidStepError, match="already run"):
            await order.wait_for_turn(4)

    asyncio.run(scenario())


def test_after_a_failed_step_every_later_step_is_refused_until_a_restart() -> None:
    async def scenario() -> None:
        order = StepOrder()
        generation = await order.wait_for_turn(1)
        waiting = asyncio.create_task(order.wait_for_turn(3))
        await asyncio.sleep(0)
        await order.failed(1, generation)
        with pytest.raises(StepRefusedError, match="follows step 1"):
            await waiting
        with pytest.raises(StepRefusedError):
            await order.wait_for_turn(2)
        await order.restart()
        await order.wait_for_turn(0)

    asyncio.run(scenario())


def test_a_step_whose_turn_came_before_a_restart_is_refused_and_its_failure_changes_nothing() -> None:
    async def scenario() -> None:
        order = StepOrder()
        generation = await order.wait_for_turn(5)
        missing_predecessor = asyncio.create_task(order.wait_for_turn(7))
        await asyncio.sleep(0)
        await order.restart()
        with pytest.raises(StepRefusedError, match="reset"):
            order.check_current(5, generation)
        with pytest.raises(StepRefusedError, match="reset"):
            await missing_predecessor
        await order.failed(5, generation)
        await order.wait_for_turn(0)

    asyncio.run(scenario())
